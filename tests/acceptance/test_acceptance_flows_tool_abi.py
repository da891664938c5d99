"""End-to-end flows of tools written by third parties that misbehave against the tool ABI
(SPEC §6, T-2, T-3, T-7; §3 W-1, W-4; docs/tools.md "Agent native mode and its frames",
"The result", "Process group and bounds"; docs/workers.md "One job", "A result too large"):
each tool is installed from a v2 manifest, granted to agent ``ci`` and run by ``ctx run``
(terminal and ``--native``) and by ``ctx queue work``, and the frames, exit statuses, the
worker's result files, the session's events and the tool's log are held to agree."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    tool_manifest,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, result_of
from tests.acceptance.workercli import storage as storage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

LIMIT = 16 * 1024 * 1024  # captured output (docs/tools.md) and max_result_bytes (workers.md)
STDERR_TAIL = 64 * 1024
GRACE = 1.0  # what a call's stragglers get after the tool exits


@dataclass
class World:
    """A bootstrapped root with the queue of project ``proj``, third-party tools installed
    in the system tier and granted to agent ``ci`` in both layers of P-6."""

    storage: Path
    box: Path  # a directory every uid may write: where tools leave pids

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def native(self, tool: str, value=None, *, session: str = "default") -> tuple[Run, list]:
        text = json.dumps({} if value is None else value)
        r = ctx_run("run", "--native", "--agent", AGENT, "--session", session, tool,
                    input=text, env=self.env)  # fmt: skip
        return r, [json.loads(line) for line in r.lines()]

    def terminal(self, tool: str, *argv: str, session: str = "default"):
        """``ctx run`` in terminal mode, its standard streams kept as bytes."""
        argv_ = [*CTX_ARGV, "run", "--agent", AGENT, "--session", session, tool, *argv]
        return subprocess.run(argv_, stdin=subprocess.DEVNULL, capture_output=True,
                              env=self.env, timeout=60)  # fmt: skip

    def work(self) -> Run:
        r = self.queue.run("work", "--agent", AGENT, "--drain", "--json", timeout=120)
        assert r.rc == 0, r
        return r

    def publish(self, tool: str, value: dict, name: str) -> str:
        return self.queue.publish({"tool": tool, "input": value}, name=name)

    def events(self, session: str) -> list[dict]:
        found = list(self.storage.glob(f"home/*/agent/{AGENT}/session/{session}/events.jsonl"))
        assert len(found) == 1, found
        return [json.loads(line) for line in found[0].read_text().splitlines()]

    def results(self, session: str, call: str) -> list[dict]:
        """The call's ``tool_result`` in the session: exactly one (T-7, S-2)."""
        mine = [e for e in self.events(session) if e.get("call") == call]
        assert [e["type"] for e in mine] == ["tool_call", "tool_result"], mine
        return mine

    def logged(self, tool: str, call: str) -> dict:
        """The call's one line in ``tool/<tool>.d/log`` (T-7)."""
        lines = (self.storage / "tool" / f"{tool}.d" / "log").read_text().splitlines()
        mine = [json.loads(line) for line in lines if f'"call":"{call}"' in line]
        assert len(mine) == 1, lines
        return mine[0]


@pytest.fixture
def make_world(storage: Path, outbox: Path, tmp_path: Path):
    def make(tools: dict[str, str]) -> World:
        for name, program in tools.items():
            manifest = tool_manifest(tmp_path / "src", name, program)
            r = ctx_run("object", "install", "--source", storage, manifest, "--tier", "system")
            assert r.rc == 0, r
        make_agent(storage, list(tools))
        for name in tools:
            allow_in_tool_policy(storage, name)
        return World(storage, outbox)

    return make


OVERFLOWED = (
    "EFBIG: its output exceeded the limit of 16777216 bytes; the rest was not read, and what "
    "still ran of it was killed"
)


def frames_of(frames: list[dict]) -> tuple[dict, dict]:
    """The ``call`` frame first, the ``result`` frame last (docs/tools.md)."""
    assert frames[0]["type"] == "call" and frames[-1]["type"] == "result", frames[:2]
    assert frames[0]["call"] == frames[-1]["call"]
    return frames[0], frames[-1]


def agrees(world: World, result: dict, session: str) -> tuple[dict, dict]:
    """The session's ``tool_result`` and the tool's log line say what the result says."""
    _, event = world.results(session, result["call"])
    line = world.logged(result["tool"], result["call"])
    error = result["error"] or {}
    for record in (event, line):
        assert record["status"] == result["status"], (record, result)
        assert record["exit_status"] == result["exit_status"], (record, result)
        if result["status"] == "error":
            assert record["errno"] == error.get("error") and record["stage"] == error["stage"]
            assert record["message"] == error["message"], (record, result)
    return event, line


# ----------------------------------------------------------------------- output shapes

SHAPES = {
    # name: (program, the output every record must carry)
    "out.text": ("#!/bin/sh\necho hello world\n", "hello world\n"),
    "out.array": ("#!/bin/sh\necho '[1, \"two\", null]'\n", [1, "two", None]),
    "out.number": ("#!/bin/sh\necho 42\n", 42),
    "out.multi": ("#!/bin/sh\necho '{\"a\": 1}'\necho '{\"b\": 2}'\n", '{"a": 1}\n{"b": 2}\n'),
    "out.nan": ("#!/bin/sh\necho '{\"x\": NaN}'\n", '{"x": NaN}\n'),
    "out.bytes": (
        "#!/bin/sh\nprintf 'a\\377b\\000c\\n'\nprintf 'e\\376\\000f\\n' >&2\n",
        "a\ufffdb\x00c\n",
    ),
}


STDERR_BYTES = "e\ufffd\x00f"


def test_output_that_is_not_one_json_object_is_kept_alike_in_every_record(make_world):
    """T-2, T-3, T-7, W-1: a tool's stdout is its JSON value when it printed one (an array, a
    number), else its text (prose, two JSON documents, ``NaN``, invalid UTF-8 and NUL bytes,
    decoded with U+FFFD); the call is ``ok``, and the native frame, the worker's ``done/``
    result, the session's events and the tool's log all carry that same output, while the
    terminal mode hands the raw bytes through untouched."""
    world = make_world({name: program for name, (program, _) in SHAPES.items()})
    for name, (_, expected) in SHAPES.items():
        r, frames = world.native(name)
        assert r.rc == 0, r
        kinds = ["call", "stderr", "result"] if name == "out.bytes" else ["call", "result"]
        assert [f["type"] for f in frames] == kinds, frames
        _, result = frames_of(frames)
        assert (result["status"], result["exit_status"], result["error"]) == ("ok", 0, None)
        assert result["output"] == expected and type(result["output"]) is type(expected), name
        if name == "out.bytes":  # its stderr line is no UTF-8 either: a frame, and the tail
            assert frames[1] == {"type": "stderr", "call": result["call"], "text": STDERR_BYTES}
            assert result["stderr"] == STDERR_BYTES + "\n", result
        event, line = agrees(world, result, "default")
        assert event["output"] == line["output"] == expected, (name, event, line)
        world.publish(name, {}, name)

    ran = world.terminal("out.bytes")
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"a\xffb\x00c\n", b"e\xfe\x00f\n")

    worker = world.work()
    summary = json.loads(worker.lines()[-1])
    assert (summary["done"], summary["failed"]) == (len(SHAPES), 0), worker
    for name, (_, expected) in SHAPES.items():
        job = f"{name}.req.json"
        assert world.queue.state(job) == "done", name
        stored = result_of(world.queue, job)
        assert (stored["status"], stored["error"], stored["reason"]) == ("ok", None, None)
        assert stored["output"] == expected, (name, stored)
        event, _ = agrees(world, stored, "worker")
        assert event["output"] == expected
    shown = world.queue.run("show", "out.bytes.req.json", "--json")
    assert shown.rc == 0 and shown.json()["result"]["output"] == "a\ufffdb\x00c\n", shown
    assert shown.json()["result"]["stderr"] == STDERR_BYTES + "\n", shown


# ----------------------------------------------------------------------- errno and exit

ERRNO_TOOL = """\
#!/bin/sh
# Reports an errno on stdout, then exits with the status it was asked for (input or argv).
if [ "$CTX_MODE" = native ]; then
  code=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["exit"])')
else
  code=$1
fi
echo '{"errno": 5, "message": "disk gone"}'
echo "status $code" >&2
exit "$code"
"""


def test_the_exit_status_decides_ok_and_an_errno_counts_only_on_a_failure(make_world):
    """T-3 and docs/tools.md "The result": ``status`` is ``ok`` when the tool exited 0, even
    when its output holds ``{"errno": N}`` (then it is plain output and the job is done);
    after a non-zero exit the errno it printed is the call's (``EIO`` at stage ``exit``,
    its message quoted) and the job fails with that reason; terminal mode exits with the
    tool's own status and captures nothing, so it records no errno."""
    world = make_world({"errno.tool": ERRNO_TOOL})
    reported = {"errno": 5, "message": "disk gone"}

    r, frames = world.native("errno.tool", {"exit": 0})
    _, ok = frames_of(frames)
    assert r.rc == 0 and (ok["status"], ok["error"], ok["output"]) == ("ok", None, reported), r
    event, _ = agrees(world, ok, "default")
    assert "errno" not in event and event["output"] == reported, event

    r, frames = world.native("errno.tool", {"exit": 3})
    _, failed = frames_of(frames)
    assert r.rc == 1, r
    assert failed["status"] == "error" and failed["exit_status"] == 3, failed
    assert failed["output"] == reported and failed["stderr"] == "status 3\n", failed
    assert failed["error"] == {"error": "EIO", "errno": 5, "stage": "exit", "step": None,
                               "step_name": None,
                               "message": "errno.tool exited with status 3: disk gone"}  # fmt: skip
    agrees(world, failed, "default")

    for code in (0, 3):
        ran = world.terminal("errno.tool", str(code))
        assert ran.returncode == code, ran
        assert json.loads(ran.stdout) == reported and ran.stderr == f"status {code}\n".encode()
    terminal = [e for e in world.events("default") if e["type"] == "tool_result"][-1]
    assert (terminal["status"], terminal["exit_status"], terminal["errno"]) == ("error", 3, None)
    assert terminal["stage"] == "exit", terminal

    done = world.publish("errno.tool", {"exit": 0}, "zero")
    failing = world.publish("errno.tool", {"exit": 3}, "three")
    world.work()
    assert world.queue.state(done) == "done" and world.queue.state(failing) == "failed"
    stored = result_of(world.queue, done)
    assert (stored["status"], stored["output"], stored["error"]) == ("ok", reported, None)
    stored = result_of(world.queue, failing)
    assert stored["reason"] == "EIO: errno.tool exited with status 3: disk gone [exit]", stored
    assert (stored["error"]["errno"], stored["error"]["stage"], stored["exit_status"]) == (
        5, "exit", 3)  # fmt: skip
    assert stored["output"] == reported and stored["stderr"] == "status 3\n", stored
    agrees(world, stored, "worker")


# ----------------------------------------------------------------------- output limit


def big(extra: int) -> str:
    return f'#!/bin/sh\nhead -c {LIMIT + extra} /dev/zero | tr "\\0" a\n'


def test_output_exactly_at_the_limit_passes_and_one_byte_over_is_efbig(make_world):
    """docs/tools.md "Process group and bounds" (captured output limited to 16 MiB) and stage
    ``run`` (``EFBIG``), docs/workers.md "A result too large": 16777216 bytes of output come
    back whole, one more is ``EFBIG`` with the tool killed; the records hold a short summary
    either way; a worker fails both under the default ``max_result_bytes`` (the result is
    larger than the output) and keeps the over-limit call's own failure in the reason; with
    a larger ``max_result_bytes`` the first is done whole and the second fails at ``run``; and
    terminal mode, which captures nothing, passes every byte through."""
    world = make_world({"out.at": big(0), "out.over": big(1)})
    r, frames = world.native("out.at")
    _, at = frames_of(frames)
    assert r.rc == 0 and at["status"] == "ok" and at["output"] == "a" * LIMIT, at["error"]
    event, line = agrees(world, at, "default")
    assert event["output"].startswith("a" * 200) and event["output"].endswith(
        f"…[+{LIMIT - 200} chars]"), event["output"][:300]  # fmt: skip
    assert line["output"] == event["output"]

    r, frames = world.native("out.over")
    _, over = frames_of(frames)
    assert r.rc == 1 and over["status"] == "error", over["error"]
    assert over["error"]["error"] == "EFBIG" and over["error"]["stage"] == "run", over["error"]
    # killed with its group, unless it had already exited when its last byte was read
    assert over["exit_status"] in (0, 128 + signal.SIGKILL), over["exit_status"]
    assert len(over["output"]) == LIMIT, "what was captured is the limit, no more"
    agrees(world, over, "default")
    for records in (world.events("default"), [world.logged("out.over", over["call"])]):
        assert all(len(json.dumps(e)) < 8192 for e in records)

    ran = world.terminal("out.over")
    assert ran.returncode == 0 and len(ran.stdout) == LIMIT + 1, ran.stderr

    at_job = world.publish("out.at", {}, "at")
    over_job = world.publish("out.over", {}, "over")
    world.work()
    stored = result_of(world.queue, at_job)
    assert world.queue.state(at_job) == "failed" and stored["exit_status"] == 0, stored
    assert stored["output"] is None and stored["output_omitted"] is True, stored
    assert stored["reason"].startswith("EFBIG: result is ") and stored["reason"].endswith(
        "the output is omitted [finish]"), stored["reason"]  # fmt: skip
    _, event = world.results("worker", stored["call"])
    assert event["status"] == "ok", "the call itself succeeded; only its result was too large"
    stored = result_of(world.queue, over_job)
    assert world.queue.state(over_job) == "failed" and stored["output_omitted"] is True
    assert stored["reason"].endswith(
        "the call had failed already: " + OVERFLOWED + " "
        "[run] [finish]"), stored["reason"]  # fmt: skip
    _, event = world.results("worker", stored["call"])
    assert (event["status"], event["errno"], event["stage"]) == ("error", "EFBIG", "run")

    # A queue whose results may be larger: the output at the limit is done, whole; the one
    # over it fails at stage run with what was captured.
    config = world.queue.dir / "config"
    config.write_text(config.read_text() + f"max_result_bytes={3 * LIMIT}\n")
    at_job = world.publish("out.at", {}, "at-again")
    over_job = world.publish("out.over", {}, "over-again")
    world.work()
    stored = result_of(world.queue, at_job)
    assert world.queue.state(at_job) == "done" and stored["output"] == "a" * LIMIT
    agrees(world, stored, "worker")
    stored = result_of(world.queue, over_job)
    assert world.queue.state(over_job) == "failed" and len(stored["output"]) == LIMIT
    assert stored["reason"] == OVERFLOWED + " [run]"
    agrees(world, stored, "worker")


# ----------------------------------------------------------------------- stdin

STDIN_TOOLS = {
    "in.one": "#!/bin/sh\nhead -c 1 >/dev/null\necho '{\"read\": 1}'\n",
    "in.closed": "#!/bin/sh\nexec 0<&-\nsleep 0.2\necho '{\"closed\": true}'\n",
}


def test_a_tool_that_reads_a_byte_of_its_input_or_closes_stdin_at_once_succeeds(make_world):
    """T-2 and docs/tools.md "Agent native mode": the input is passed on the tool's stdin,
    and a tool that stops reading is its own business: a 4 MiB input read one byte, or stdin
    closed at once, still ends ``ok`` with the tool's output, promptly, in ``ctx run`` and in
    a worker (``done/``); the session keeps a summary of the input (S-4), not the input."""
    world = make_world(STDIN_TOOLS)
    blob = "x" * (4 * 1024 * 1024)
    expected = {"in.one": {"read": 1}, "in.closed": {"closed": True}}
    for name in STDIN_TOOLS:
        started = time.monotonic()
        r, frames = world.native(name, {"blob": blob})
        assert time.monotonic() - started < 10, name
        _, result = frames_of(frames)
        assert r.rc == 0 and result["status"] == "ok", r.out[-600:]
        assert result["output"] == expected[name], result
        agrees(world, result, "default")
        call, _ = world.results("default", result["call"])
        line = world.logged(name, result["call"])
        summary = "x" * 200 + f"…[+{len(blob) - 200} chars]"
        assert call["input"] == line["input"] == {"blob": summary}, call
        world.publish(name, {"blob": "y" * 900_000}, name)
    world.work()
    for name in STDIN_TOOLS:
        job = f"{name}.req.json"
        stored = result_of(world.queue, job)
        assert world.queue.state(job) == "done" and stored["output"] == expected[name], stored
        agrees(world, stored, "worker")


# ----------------------------------------------------------------------- daemons


def daemon_tools(box: Path) -> dict[str, str]:
    return {
        # Leaves a child in its process group holding its stdout and stderr.
        "fork.daemon": f"#!/bin/sh\nsleep 300 &\necho $! > {box}/daemon.$CTX_CALL\n"
        "echo '{\"forked\": true}'\n",
        # Starts a child in a session of its own and waits until it is there.
        "fork.setsid": "#!/bin/sh\n"
        f"setsid sh -c 'echo $$ > {box}/setsid.$CTX_CALL.tmp; "
        f"mv {box}/setsid.$CTX_CALL.tmp {box}/setsid.$CTX_CALL; exec sleep 300' "
        "</dev/null >/dev/null 2>&1 &\n"
        f"while [ ! -e {box}/setsid.$CTX_CALL ]; do sleep 0.02; done\n"
        "echo '{\"escaped\": true}'\n",
    }


@contextlib.contextmanager
def escaped_killed(box: Path) -> Iterator[None]:
    """Whatever escaped a call's group is this test's to end."""
    try:
        yield
    finally:
        for pidfile in box.glob("setsid.*"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def pid_of(box: Path, kind: str, call: str) -> int:
    return int((box / f"{kind}.{call}").read_text())


def session_id(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def test_a_daemon_left_in_the_group_is_killed_and_one_that_calls_setsid_escapes(make_world, outbox):
    """W-4 and docs/tools.md "Process group and bounds": a child the tool leaves running in
    its process group (here holding its stdout) gets a one-second grace and is killed with
    the group, the call ending ``ok`` with what the tool printed, in native mode, terminal
    mode and a worker alike; a child that leaves the group with ``setsid`` is, as documented,
    not killed (no process of the group is left, but it is no longer in it), and the call
    does not wait for it."""
    world = make_world(daemon_tools(outbox))
    box = world.box
    with escaped_killed(box):
        started = time.monotonic()
        r, frames = world.native("fork.daemon")
        took = time.monotonic() - started
        _, result = frames_of(frames)
        assert r.rc == 0 and result["output"] == {"forked": True}, r
        assert GRACE <= took < GRACE + 8, took
        assert not alive(pid_of(box, "daemon", result["call"])), "the group was not killed"
        agrees(world, result, "default")

        started = time.monotonic()
        r, frames = world.native("fork.setsid")
        _, result = frames_of(frames)
        assert r.rc == 0 and result["output"] == {"escaped": True}, r
        assert time.monotonic() - started < GRACE + 8
        escaped = pid_of(box, "setsid", result["call"])
        assert alive(escaped) and session_id(escaped) == escaped, "setsid(2) made its session"
        agrees(world, result, "default")

        ran = world.terminal("fork.daemon")
        assert ran.returncode == 0 and json.loads(ran.stdout) == {"forked": True}, ran
        last = [e for e in world.events("default") if e["type"] == "tool_result"][-1]
        assert not alive(pid_of(box, "daemon", last["call"]))

        daemon_job = world.publish("fork.daemon", {}, "daemon")
        setsid_job = world.publish("fork.setsid", {}, "setsid")
        world.work()
        daemon = result_of(world.queue, daemon_job)
        assert world.queue.state(daemon_job) == "done" and daemon["output"] == {"forked": True}
        assert not alive(pid_of(box, "daemon", daemon["call"]))
        escaped_too = result_of(world.queue, setsid_job)
        assert world.queue.state(setsid_job) == "done", escaped_too
        assert alive(pid_of(box, "setsid", escaped_too["call"])), "the worker is gone; it is not"
        agrees(world, daemon, "worker")
        agrees(world, escaped_too, "worker")


# ----------------------------------------------------------------------- stderr flood

FLOOD = """\
#!/bin/sh
python3 -c '
import sys
for i in range(20000):
    sys.stderr.write("line %05d " % i + "x" * 90 + "\\n")
sys.stderr.write("\\u00e9" * 100000 + "\\n")
sys.stderr.write("LAST LINE\\n")
print("{\\"flooded\\": true}")
'
exit 3
"""


def test_a_tool_that_floods_stderr_is_framed_line_by_line_and_keeps_only_a_tail(make_world):
    """docs/tools.md frames and result: every stderr line is a ``stderr`` frame, a line
    longer than 64 KiB comes in pieces of at most 64 KiB with no character split, the result
    keeps the last 64 KiB, and the message of a non-zero exit quotes the last line; a worker
    fails the job with that reason and the end of that tail, while terminal mode hands all 2 MiB of
    stderr through and exits 3."""
    world = make_world({"flood.err": FLOOD})
    r, frames = world.native("flood.err")
    assert r.rc == 1, r.err
    _, result = frames_of(frames)
    texts = [f["text"] for f in frames if f["type"] == "stderr"]
    assert texts[:1] == ["line 00000 " + "x" * 90] and texts[-1] == "LAST LINE", texts[-1:]
    long = texts[20000:-1]
    assert "".join(long) == "\u00e9" * 100000, [len(t) for t in long]
    assert all(len(t.encode()) <= STDERR_TAIL for t in long) and len(long) >= 4
    assert all(f["call"] == result["call"] for f in frames)
    tail = result["stderr"]
    assert len(tail.encode()) <= STDERR_TAIL and tail.endswith("\u00e9\nLAST LINE\n"), tail[-20:]
    assert "\ufffd" not in tail, "the tail starts at a character"
    assert result["output"] == {"flooded": True} and result["exit_status"] == 3
    assert result["error"]["message"] == "flood.err exited with status 3: LAST LINE"
    assert result["error"]["errno"] is None and result["error"]["stage"] == "exit"
    agrees(world, result, "default")

    ran = world.terminal("flood.err")
    assert ran.returncode == 3 and json.loads(ran.stdout) == {"flooded": True}
    assert len(ran.stderr) == 20000 * 102 + 200001 + 10, len(ran.stderr)

    job = world.publish("flood.err", {}, "flood")
    world.work()
    stored = result_of(world.queue, job)
    assert world.queue.state(job) == "failed", stored
    assert stored["reason"] == "flood.err exited with status 3: LAST LINE [exit]", stored
    # "the tail of stderr" (docs/workers.md): the end of what the call kept, whatever its size
    kept = stored["stderr"]
    assert kept.endswith("\u00e9\nLAST LINE\n") and tail.endswith(kept), kept[-20:]
    assert stored["output"] == {"flooded": True}
    agrees(world, stored, "worker")


# ----------------------------------------------------------------------- signals

SIGNAL_TOOL = """\
#!/bin/sh
if [ "$CTX_MODE" = native ]; then
  sig=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["signal"])')
else
  sig=$1
fi
echo "about to take SIG$sig" >&2
kill -s "$sig" $$
sleep 5
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM])
def test_a_tool_killed_by_a_signal_ends_with_128_plus_n_at_stage_exit(make_world, sig):
    """docs/tools.md "The result" (exit status 128 + N after signal N) and "The core tools":
    a third-party tool that dies by a signal — SIGSEGV included, which is ``ENOEXEC`` only for
    a damaged core tool — is an error at stage ``exit`` with no errno, its last stderr line
    quoted; ``ctx run`` exits 1 (native) or 128 + N (terminal), a worker fails the job with
    that reason, and the session and tool log agree."""
    world = make_world({"sig.self": SIGNAL_TOOL})
    name, status = sig.name.removeprefix("SIG"), 128 + sig
    message = f"sig.self exited with status {status}: about to take SIG{name}"
    r, frames = world.native("sig.self", {"signal": name})
    _, result = frames_of(frames)
    assert r.rc == 1 and result["exit_status"] == status, r
    assert result["error"] == {"error": None, "errno": None, "stage": "exit", "step": None,
                               "step_name": None, "message": message}  # fmt: skip
    agrees(world, result, "default")

    ran = world.terminal("sig.self", name)
    assert ran.returncode == status, ran
    assert ran.stderr.decode().startswith(f"about to take SIG{name}\n"), ran.stderr

    job = world.publish("sig.self", {"signal": name}, "sig")
    world.work()
    stored = result_of(world.queue, job)
    assert world.queue.state(job) == "failed" and stored["exit_status"] == status, stored
    assert stored["reason"] == f"{message} [exit]", stored["reason"]
    assert stored["error"]["errno"] is None and stored["error"]["stage"] == "exit"
    agrees(world, stored, "worker")
