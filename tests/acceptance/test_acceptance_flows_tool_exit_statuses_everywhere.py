"""A tool's end, every way it can end, seen through every surface that reports it (SPEC T-3,
T-7, S-2, S-5, W-1, W-4, H-1, M-1, M-4; docs/tools.md "Running a tool", "Terminal CLI mode",
"Agent native mode and its frames", "The result", "Process group and bounds", "The agent
terminal", "MCP servers as tool sources"; docs/sessions.md "Events"; docs/workers.md "One
job"; ``ctx run --help``).

One tool, ``end``, ends as it is told: it exits 0, 1, 3, 125, 126, 127, 128, 130, 137, 143 or
255; it is killed by SIGTERM, SIGKILL, SIGSEGV, SIGABRT, SIGPIPE or SIGHUP; it execs a
program that is not there; it closes its standard output and goes on; it exits while a child
still holds its standard output; it times out; it is interrupted through its caller.  Beside
it, tools that cannot start: no execute bit, execute bits that are not the agent's, a ``#!``
interpreter that is missing, not executable or not a program, a text with no ``#!`` line.
Each end is read from:

* ``ctx run`` in terminal mode: its exit status (the tool's own, 128 + N after signal N; 126
  refused or not started, 127 not found; 128 + N of a signal ``ctx run`` itself got);
* ``ctx run --native``: its exit status (0 ok, 1 otherwise) and its frames (``call`` first,
  ``result`` last: ``status``, ``exit_status``, ``error`` with ``error``/``errno``/``stage``);
* the session's ``tool_result`` event and the line of ``tool/<name>.d/log`` of the same call;
* ``ctx queue work``: the job in ``done/`` or ``failed/``, its result's ``exit_status``,
  ``error`` and ``reason``;
* tsh in an agent terminal: ``$?`` as ``exit`` without a number leaves with it (the
  ``terminal.stopped`` event, and a foreground ``bin/ctxterm``'s own exit status);
* an MCP-backed tool whose server exits or is killed before it answers.

Every surface must give the same end, and the one the documents give.  The processes, roots
and terminals looked at are only the ones these tests start."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    Run,
    alive,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, coder_host
from tests.support.mcp_wire import WIRE

TOP = scratch_top(__file__)
PYTHON = REPO / ".venv" / "bin" / "python"
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid (nobody): needs root"
)
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

# The tool ``end``: ACTION and N come from its arguments (terminal mode, tsh) or from the
# "how" string of its JSON input (native mode, a worker's job).
END = r"""#!/bin/sh
if [ $# -eq 0 ]; then
    IFS= read -r line
    how=$(printf '%s\n' "$line" | sed -n 's/.*"how": *"\([^"]*\)".*/\1/p')
    set -- $how
fi
if [ "$1" = errno ]; then
    echo '{"errno": 13, "message": "refused by the tool itself"}'
    exit "$2"
fi
echo "out $*"
echo "err $*" >&2
case $1 in
exit) exit "$2" ;;
signal) kill -s "$2" $$; sleep 5; exit 99 ;;
missing) exec /nonexistent/program ;;
close) exec >&-; sleep 0.3; echo "went on after closing stdout" >&2; exit "$2" ;;
child) (sleep 30; echo late) & echo "child $!" >&2; exit "$2" ;;
leave) sleep 30 & sleep 1; exit 0 ;;
sleep) sleep 30 ;;
trap) trap 'echo caught >&2; exit 7' TERM HUP; echo ready >&2
      while :; do sleep 0.1; done ;;
stty) stty -echo; stty echo; exit "$2" ;;
sttykill) stty -echo; kill -s KILL $$ ;;
esac
exit 98
"""

# (how, the tool's exit status as every surface must give it)
CASES = [
    ("exit 0", 0),
    ("exit 1", 1),
    ("exit 3", 3),
    ("exit 125", 125),
    ("exit 126", 126),
    ("exit 127", 127),
    ("exit 128", 128),
    ("exit 130", 130),
    ("exit 137", 137),
    ("exit 143", 143),
    ("exit 255", 255),
    ("signal TERM", 143),
    ("signal KILL", 137),
    ("signal SEGV", 139),
    ("signal ABRT", 134),
    ("signal PIPE", 141),
    ("signal HUP", 129),
    ("missing", 127),
    ("close 0", 0),
    ("child 4", 4),
]
ERRNO_CASES = [("errno 1", 1), ("errno 0", 0)]

# Tools that never start, or are never found: (tool, terminal status, errno, stage).
UNSTARTABLE = [
    ("badinterp", 126, "ENOENT", "run"),
    ("noshebang", 126, "ENOEXEC", "run"),
    ("nonexec", 127, "ENOENT", "resolve"),
    ("rootonly", 126, "EACCES", "authorize"),
]
ERRNOS = {"ENOENT": 2, "ENOEXEC": 8, "EACCES": 13, "EIO": 5, "EINTR": 4, "ETIMEDOUT": 110}


def slug(how: str) -> str:
    return how.replace(" ", "-")


def fresh(prefix: str) -> str:
    """A session name of its own (R-3), so that its events are one call's."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` (uid nobody) granted ``end`` and the tools that cannot start, in both
    layers of P-6."""
    tools = ["end", "badinterp", "noshebang", "nonexec", "rootonly", "interp644", "interpempty"]
    with coder_host(_template, TOP, tools, {}) as h:
        interpreters = h.top / "interpreters"
        interpreters.mkdir(mode=0o755)
        (interpreters / "noexec").write_text("#!/bin/sh\necho interpreted\n")
        (interpreters / "noexec").chmod(0o644)  # no execute bit: the kernel says EACCES
        (interpreters / "empty").write_text("")
        (interpreters / "empty").chmod(0o755)  # no program in it: the kernel says ENOEXEC
        programs = {
            "end": END,
            "badinterp": "#!/nonexistent/interpreter\necho never\n",
            "noshebang": "echo ran-without-an-interpreter-line\nexit 4\n",
            "nonexec": "#!/bin/sh\necho never\n",
            "rootonly": "#!/bin/sh\necho never\n",
            "interp644": f"#!{interpreters / 'noexec'}\necho never\nexit 5\n",
            "interpempty": f"#!{interpreters / 'empty'}\necho ran-under-sh\nexit 5\n",
        }
        for name, program in programs.items():
            h.install(name, program)
            h.grant_in_tool(name)
        (h.storage / "tool" / "nonexec").chmod(0o644)  # not a hit on CTX_PATH (T-4)
        (h.storage / "tool" / "rootonly").chmod(0o700)  # a hit, refused at step 2
        yield h


@pytest.fixture(scope="module")
def worked(host: CoderHost) -> dict[str, tuple[str, dict]]:
    """Every case as a job of project ``exits``, drained by one worker of agent ``coder``:
    job name to (``done`` or ``failed``, its result)."""
    queue = QueueCLI(host.storage, "exits")
    made = queue.run("init", env=host.env)
    assert made.rc == 0, made
    jobs = {}
    for how, _ in CASES + ERRNO_CASES:
        request = {"tool": "end", "input": {"how": how}, "from": "tester"}
        jobs[slug(how)] = queue.publish(request, name=slug(how))
    for tool, *_ in UNSTARTABLE:
        jobs[tool] = queue.publish({"tool": tool, "input": {}, "from": "tester"}, name=tool)
    argv = ["--agent", "coder", "--drain", "--concurrency", "4", "--timeout", "30", "--json"]
    ran = queue.run("work", *argv, env=host.env, timeout=120)
    assert ran.rc == 0, ran
    return {key: queue.only_result(job) for key, job in jobs.items()}


# --------------------------------------------------------------------------------- readers


def session_results(storage: Path, agent: str, session: str, uid: int = 65534) -> list[dict]:
    events = read_jsonl(
        storage / "home" / str(uid) / "agent" / agent / "session" / session / "events.jsonl"
    )
    return [e for e in events if e["type"] == "tool_result"]


def the_result(host: CoderHost, session: str, agent: str = "coder") -> dict:
    """The one ``tool_result`` of ``session``, which holds one call."""
    found = session_results(host.storage, agent, session, host.uid)
    assert len(found) == 1, found
    return found[0]


def log_line(host: CoderHost, tool: str, call: str) -> dict:
    """The line of ``tool/TOOL.d/log`` of ``call``."""
    lines = [
        e for e in read_jsonl(host.storage / "tool" / f"{tool}.d" / "log") if e["call"] == call
    ]
    assert len(lines) == 1, (tool, call, lines)
    return lines[0]


def frames_of(ran: Run) -> list[dict]:
    frames = [json.loads(line) for line in ran.lines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", ran
    assert [f["type"] for f in frames].count("result") == 1, ran
    return frames


def assert_record(record: dict, *, status: int | None, errno_name: str | None, stage: str | None):
    """A ``tool_result`` event or log line that says the call ended so."""
    assert record["type"] == "tool_result", record
    assert record["exit_status"] == status, record
    ok = errno_name is None and stage is None
    assert record["status"] == ("ok" if ok else "error"), record
    assert record.get("errno") == errno_name, record
    assert record.get("stage") == stage, record


def terminal(host: CoderHost, tool: str, *argv: str, agent: str = "coder", **kw):
    """``ctx run`` in terminal mode in a session of its own: the run, its ``tool_result``."""
    session = fresh("t")
    ran = host.ctx("run", "--agent", agent, "--session", session, tool, *argv, **kw)
    return ran, the_result(host, session, agent)


def native(host: CoderHost, tool: str, payload: dict, *options: str, agent: str = "coder"):
    """``ctx run --native`` in a session of its own: the run, its frames, its ``tool_result``."""
    session = fresh("n")
    ran = host.ctx(
        "run",
        "--agent",
        agent,
        "--native",
        "--session",
        session,
        *options,
        tool,
        input=json.dumps(payload),
    )
    return ran, frames_of(ran), the_result(host, session, agent)


def assert_frame(frame: dict, *, status: int | None, errno_name: str | None, stage: str | None):
    assert frame["exit_status"] == status, frame
    if errno_name is None and stage is None:
        assert frame["status"] == "ok" and frame["error"] is None, frame
        return
    assert frame["status"] == "error", frame
    error = frame["error"]
    assert error["stage"] == stage, frame
    assert error["error"] == errno_name, frame
    assert error["errno"] == (ERRNOS[errno_name] if errno_name else None), frame


def assert_worker_result(result: dict, *, status: int | None, errno_name, stage, tool="end"):
    assert result["exit_status"] == status, result
    if errno_name is None and stage is None:
        assert result["status"] == "ok" and result.get("error") is None, result
        return
    assert result["status"] == "error", result
    assert result["error"]["stage"] == stage and result["error"]["error"] == errno_name, result
    assert result["reason"].endswith(f"[{stage}]"), result
    if errno_name is not None:
        assert result["reason"].startswith(f"{errno_name}: "), result
    else:
        assert result["reason"].startswith(f"{tool} exited with status {status}"), result


# ------------------------------------------------------------------ one end, every surface


@pytest.mark.parametrize(("how", "status"), CASES, ids=[slug(h) for h, _ in CASES])
def test_every_surface_reports_the_same_end_of_the_tool(
    host: CoderHost, worked: dict, how: str, status: int
) -> None:
    """T-3, S-2, T-7, W-1: terminal mode exits with the tool's status (128 + N after signal
    N); native mode exits 0 or 1 with the status in its ``result`` frame; the session's
    ``tool_result`` and the tool's log line say the same, with stage ``exit`` and no errno
    for a non-zero end; the worker finishes the job in ``done/`` only for 0."""
    failed = status != 0
    stage = "exit" if failed else None

    ran, event = terminal(host, "end", *how.split())
    assert ran.rc == status, ran
    assert f"err {how}\n" in ran.err, ran  # the caller's stderr, lent
    assert_record(event, status=status, errno_name=None, stage=stage)
    assert_record(log_line(host, "end", event["call"]), status=status, errno_name=None, stage=stage)
    if failed:
        assert event["message"] == f"end exited with status {status}", event

    ran, frames, event = native(host, "end", {"how": how})
    assert ran.rc == (1 if failed else 0), ran
    call, result = frames[0], frames[-1]
    assert call["type"] == "call" and call["call"] == result["call"] == event["call"], frames
    assert_frame(result, status=status, errno_name=None, stage=stage)
    assert f"err {how}\n" in result["stderr"], result
    assert_record(event, status=status, errno_name=None, stage=stage)
    assert_record(log_line(host, "end", event["call"]), status=status, errno_name=None, stage=stage)

    state, job = worked[slug(how)]
    assert state == ("failed" if failed else "done"), job
    assert_worker_result(job, status=status, errno_name=None, stage=stage)
    worker_event = [
        e
        for e in session_results(host.storage, "coder", "worker", host.uid)
        if e["call"] == job["call"]
    ]
    assert len(worker_event) == 1, job
    assert_record(worker_event[0], status=status, errno_name=None, stage=stage)
    assert_record(log_line(host, "end", job["call"]), status=status, errno_name=None, stage=stage)


def test_a_tool_that_closes_stdout_and_goes_on_is_waited_for_to_its_exit(
    host: CoderHost, worked: dict
) -> None:
    """docs/tools.md "The result": the call ends when the tool exits, not when its stdout
    closes: what it wrote on stderr after the close is kept, its output is what it wrote
    before."""
    _ran, frames, _event = native(host, "end", {"how": "close 0"})
    result = frames[-1]
    assert result["output"] == "out close 0\n", result
    assert "went on after closing stdout" in result["stderr"], result
    assert result["timings_ms"]["run"] >= 250, result
    _state, job = worked["close-0"]
    assert "went on after closing stdout" in job["stderr"], job


def test_a_child_holding_stdout_is_killed_after_the_grace_on_every_surface(
    host: CoderHost, worked: dict
) -> None:
    """docs/tools.md "Process group and bounds": the tool exits 4 while a child of its group
    still holds its stdout; the call ends with 4 after the one-second grace (not the child's
    30 s), and the child is dead by then, in terminal and native mode and in a worker."""
    started = time.monotonic()
    ran, _event = terminal(host, "end", "child", "4")
    assert ran.rc == 4 and time.monotonic() - started < 15, ran
    children = [int(line.split()[1]) for line in ran.err.splitlines() if line.startswith("child ")]
    _ran, frames, _event = native(host, "end", {"how": "child 4"})
    result = frames[-1]
    assert result["exit_status"] == 4 and result["timings_ms"]["run"] < 15000, result
    children += [
        int(line.split()[1]) for line in result["stderr"].splitlines() if line.startswith("child ")
    ]
    _state, job = worked["child-4"]
    children += [
        int(line.split()[1]) for line in job["stderr"].splitlines() if line.startswith("child ")
    ]
    assert len(children) == 3, (ran, result, job)
    assert wait_for(lambda: not any(alive(pid) for pid in children), 5), children
    assert "late" not in ran.out and "late" not in str(result["output"]), (ran, result)


@pytest.mark.parametrize(("how", "status"), ERRNO_CASES, ids=[slug(h) for h, _ in ERRNO_CASES])
def test_an_errno_the_tool_prints_is_its_errno_only_when_it_fails(
    host: CoderHost, worked: dict, how: str, status: int
) -> None:
    """docs/tools.md stage ``exit``: a tool that exits non-zero after printing
    ``{"errno": 13, "message": …}`` fails with EACCES at stage ``exit`` (frame, session, log,
    worker reason); exiting 0 after printing it is a success whose output is that object."""
    ran, frames, event = native(host, "end", {"how": how})
    result = frames[-1]
    assert result["output"] == {"errno": 13, "message": "refused by the tool itself"}, result
    errno_name, stage = ("EACCES", "exit") if status else (None, None)
    assert ran.rc == (1 if status else 0), ran
    assert_frame(result, status=status, errno_name=errno_name, stage=stage)
    if status:
        assert "refused by the tool itself" in result["error"]["message"], result
    assert_record(event, status=status, errno_name=errno_name, stage=stage)
    assert_record(
        log_line(host, "end", event["call"]), status=status, errno_name=errno_name, stage=stage
    )
    state, job = worked[slug(how)]
    assert state == ("failed" if status else "done"), job
    assert_worker_result(job, status=status, errno_name=errno_name, stage=stage)


# ------------------------------------------------------------------ tools that never start


@pytest.mark.parametrize(
    ("tool", "rc", "errno_name", "stage"), UNSTARTABLE, ids=[u[0] for u in UNSTARTABLE]
)
def test_a_tool_that_never_starts_has_no_exit_status_anywhere(
    host: CoderHost, worked: dict, tool: str, rc: int, errno_name: str, stage: str
) -> None:
    """docs/tools.md stages ``resolve``, ``authorize``, ``run``: a tool with no execute bit
    is not found (127), one whose bits are not the agent's is refused at step 2 (126), a
    missing interpreter and a text without ``#!`` cannot start (126) — ``exit_status`` null
    on every surface, never the 126 or 127 of a tool that ran; the worker fails the job."""
    ran, event = terminal(host, tool)
    assert ran.rc == rc, ran
    assert f"ctx: {errno_name}: " in ran.err, ran
    assert "never" not in ran.out, ran
    assert_record(event, status=None, errno_name=errno_name, stage=stage)

    ran, frames, event = native(host, tool, {})
    assert ran.rc == 1, ran
    assert [f["type"] for f in frames] == ["result"], frames  # refused before a process ran
    assert_frame(frames[-1], status=None, errno_name=errno_name, stage=stage)
    assert frames[-1]["output"] is None, frames
    assert_record(event, status=None, errno_name=errno_name, stage=stage)
    if stage != "resolve":  # a tool not found has no log to write in
        assert_record(
            log_line(host, tool, event["call"]), status=None, errno_name=errno_name, stage=stage
        )

    state, job = worked[tool]
    assert state == "failed", job
    assert_worker_result(job, status=None, errno_name=errno_name, stage=stage, tool=tool)


def test_an_interpreter_without_execute_bit_is_eacces_at_stage_run_in_both_modes(
    host: CoderHost,
) -> None:
    _ran, frames, native_event = native(host, "interp644", {})
    assert_frame(frames[-1], status=None, errno_name="EACCES", stage="run")
    assert_record(native_event, status=None, errno_name="EACCES", stage="run")
    ran, event = terminal(host, "interp644")
    assert ran.rc == 126 and "ctx: EACCES: " in ran.err, ran
    assert_record(event, status=None, errno_name="EACCES", stage="run")


def test_an_interpreter_that_is_no_program_does_not_run_the_tool_under_sh(
    host: CoderHost,
) -> None:
    ran, frames, event = native(host, "interpempty", {})
    result = frames[-1]
    assert "ran-under-sh" not in json.dumps(result), result
    assert_frame(result, status=None, errno_name="ENOEXEC", stage="run")
    assert_record(event, status=None, errno_name="ENOEXEC", stage="run")
    ran, event = terminal(host, "interpempty")
    assert ran.rc == 126 and "ran-under-sh" not in ran.out, ran


# -------------------------------------------------------------------------------- timeouts


def test_a_timeout_is_etimedout_with_137_on_every_surface(host: CoderHost) -> None:
    """W-4, docs/tools.md stage ``run``: a tool past ``--timeout`` has its group killed:
    terminal mode exits 137 saying ETIMEDOUT, native mode's result is ETIMEDOUT at stage
    ``run`` with exit status 137 and the output written so far, and a worker fails the job
    with that reason."""
    started = time.monotonic()
    session = fresh("t")
    ran = host.ctx(
        "run", "--agent", "coder", "--session", session, "--timeout", "1", "end", "sleep"
    )
    assert ran.rc == 137 and "ctx: ETIMEDOUT: " in ran.err, ran
    event = the_result(host, session)
    assert_record(event, status=137, errno_name="ETIMEDOUT", stage="run")
    assert_record(
        log_line(host, "end", event["call"]), status=137, errno_name="ETIMEDOUT", stage="run"
    )

    ran, frames, event = native(host, "end", {"how": "sleep"}, "--timeout", "1")
    assert ran.rc == 1, ran
    assert_frame(frames[-1], status=137, errno_name="ETIMEDOUT", stage="run")
    assert frames[-1]["output"] == "out sleep\n", frames[-1]
    assert_record(event, status=137, errno_name="ETIMEDOUT", stage="run")

    queue = QueueCLI(host.storage, "timeouts")
    assert queue.run("init", env=host.env).rc == 0
    job = queue.publish({"tool": "end", "input": {"how": "sleep"}, "from": "tester"})
    worked = queue.run("work", "--agent", "coder", "--drain", "--timeout", "1", env=host.env)
    assert worked.rc == 0, worked
    state, result = queue.only_result(job)
    assert state == "failed", result
    assert_worker_result(result, status=137, errno_name="ETIMEDOUT", stage="run")
    assert time.monotonic() - started < 30


def test_a_tool_done_in_time_whose_child_outlives_the_timeout_ends_alike_in_both_modes(
    host: CoderHost,
) -> None:
    session = fresh("t")
    ran = host.ctx(
        "run", "--agent", "coder", "--session", session, "--timeout", "1.9", "end", "leave"
    )
    terminal_event = the_result(host, session)
    _ran, frames, native_event = native(host, "end", {"how": "leave"}, "--timeout", "1.9")
    assert frames[-1]["exit_status"] == terminal_event["exit_status"] == 0, frames[-1]
    assert (native_event["status"], native_event.get("errno")) == (
        terminal_event["status"],
        terminal_event.get("errno"),
    ), (native_event, terminal_event, ran)


# ------------------------------------------------------------ signals to the caller itself


def read_until(stream, wanted: bytes, seconds: float = 20) -> bytes:
    """What ``stream`` gave until a line holding ``wanted``, read without blocking forever."""
    seen = b""
    deadline = time.monotonic() + seconds
    fd = stream.fileno()
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, seen
            seen += chunk
    return seen


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_to_ctx_run_in_terminal_mode_is_128_plus_n_with_the_tools_own_status(
    host: CoderHost, signum: int
) -> None:
    """docs/tools.md "Terminal CLI mode": the signal, sent while the tool runs, is passed on
    to the tool's group, which handles it and exits 7; the call is EINTR at stage ``run``
    with exit status 7 (session and log), and ``ctx run`` exits 128 + N."""
    session = fresh("t")
    argv = [*CTX_ARGV, "run", "--agent", "coder", "--session", session, "end", "trap"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env
    )
    try:
        read_until(proc.stderr, b"ready\n")
        time.sleep(0.5)  # well into the call (see the test of a signal as the tool starts)
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, err
    assert b"ctx: EINTR: " in err, err
    event = the_result(host, session)
    assert_record(event, status=7, errno_name="EINTR", stage="run")
    assert_record(log_line(host, "end", event["call"]), status=7, errno_name="EINTR", stage="run")


def tool_started(pid: int, program: str) -> bool:
    """Whether a child of ``pid`` runs ``program`` (the tool's script, past its launcher)."""
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return False
    for child in children:
        with contextlib.suppress(psutil.Error):
            if program in child.cmdline():
                return True
    return False


def test_a_signal_reaching_ctx_run_as_its_tool_starts_keeps_the_tools_exit_status(
    host: CoderHost,
) -> None:
    program = str(host.storage / "tool" / "end")
    for _attempt in range(8):
        session = fresh("t")
        argv = [*CTX_ARGV, "run", "--agent", "coder", "--session", session, "end", "trap"]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=host.env,
        )
        try:
            assert wait_for(lambda proc=proc: tool_started(proc.pid, program), 20, 0.001)
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 143, err
        event = the_result(host, session)
        assert event["errno"] == "EINTR", event
        assert event["exit_status"] is not None, event  # its script was running


def test_sigterm_to_ctx_run_native_is_143_and_a_result_frame_of_eintr(host: CoderHost) -> None:
    """docs/tools.md "Agent native mode": SIGTERM kills the tool's group; the ``result``
    frame, last, is EINTR at stage ``run`` with exit status 137 (the SIGKILL's), the session
    and the log say the same, and ``ctx run`` exits 143."""
    session = fresh("n")
    argv = [*CTX_ARGV, "run", "--agent", "coder", "--native", "--session", session, "end"]
    given = host.top / f"{session}.json"
    given.write_text(json.dumps({"how": "trap"}))
    with given.open("rb") as stdin:
        proc = subprocess.Popen(
            argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env
        )
    try:
        seen = read_until(proc.stdout, b'"text": "ready"')
        proc.send_signal(signal.SIGTERM)
        out, _err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143
    frames = [json.loads(line) for line in (seen + out).decode().splitlines() if line.strip()]
    assert frames[0]["type"] == "call" and frames[-1]["type"] == "result", frames
    assert_frame(frames[-1], status=137, errno_name="EINTR", stage="run")
    event = the_result(host, session)
    assert event["call"] == frames[-1]["call"], (event, frames)
    assert_record(event, status=137, errno_name="EINTR", stage="run")


# ------------------------------------------------------------------------ on a real terminal


def lead_a_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is its stdin (what a
    terminal emulator, sshd or ``docker exec -t`` give the program they start)."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def drain(master: int) -> bytes:
    os.set_blocking(master, False)
    data = b""
    try:
        while chunk := os.read(master, 65536):
            data += chunk
    except OSError:
        pass
    return data


def test_ctx_run_leading_its_terminal_returns_the_status_of_a_tool_that_sets_modes(
    host: CoderHost,
) -> None:
    for _attempt in range(6):
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [*CTX_ARGV, "run", "--agent", "coder", "end", "stty", "5"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=host.env,
            preexec_fn=lead_a_terminal,
        )
        os.close(slave)
        try:
            status = proc.wait(timeout=4)
        except subprocess.TimeoutExpired:
            status = None
            os.killpg(proc.pid, signal.SIGKILL)  # the tool dies with it (its parent-death signal)
            proc.wait()
        finally:
            os.close(master)
        assert status == 5, "ctx run still waited for its tool 4 s later"


def test_a_tool_killed_after_changing_the_terminal_leaves_its_modes_restored(
    host: CoderHost,
) -> None:
    """docs/tools.md "Terminal CLI mode": under an interactive shell with job control, a tool
    that turns echo off and is then killed by SIGKILL makes ``ctx run`` exit 137, recorded
    so, and finds echo on again afterwards, as a shell restores it."""
    session = fresh("t")
    command = f"{CTX_ARGV[0]} run --agent coder --session {session} end sttykill; echo rc=$?"
    master, slave = pty.openpty()
    try:
        assert termios.tcgetattr(slave)[3] & termios.ECHO
        proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "-i", "-c", command],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=host.env,
            preexec_fn=lead_a_terminal,
        )
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shown = drain(master)
        assert b"rc=137" in shown, shown
        assert termios.tcgetattr(slave)[3] & termios.ECHO, shown
    finally:
        os.close(slave)
        os.close(master)
    assert_record(the_result(host, session), status=137, errno_name=None, stage="exit")


# ------------------------------------------------------------------------- tsh in a terminal

TSH = [
    ("end exit 3", "end", 3, 3, None, "exit"),
    ("end signal SEGV", "end", 139, 139, None, "exit"),
    ("end signal KILL", "end", 137, 137, None, "exit"),
    ("end missing", "end", 127, 127, None, "exit"),
    ("badinterp", "badinterp", 126, None, "ENOENT", "run"),
]


def ended_terminal(host: CoderHost, session: str) -> dict:
    """The ``terminal.stopped`` event of ``session``, once its terminal has ended itself."""
    host.started.remove(session)

    def stopped() -> list[dict]:
        return [e for e in host.lifecycle(session) if e["type"] == "terminal.stopped"]

    assert wait_for(lambda: bool(stopped()), 20), host.lifecycle(session)
    return stopped()[0]


@needs_terminal
@pytest.mark.parametrize(
    ("line", "tool", "dollar", "status", "errno_name", "stage"),
    TSH,
    ids=[t[0].replace(" ", "-") for t in TSH],
)
def test_tsh_dollar_question_is_the_status_ctx_run_exits_with(
    host: CoderHost,
    line: str,
    tool: str,
    dollar: int,
    status: int | None,
    errno_name: str | None,
    stage: str,
) -> None:
    """H-1, T-3, docs/tools.md "The agent terminal": a tool typed at tsh runs as in terminal
    mode; ``exit`` without a number leaves with ``$?``, which ``terminal.stopped`` records:
    the tool's status (128 + N after signal N), 126 for one that could not start — the same
    as ``ctx run`` exits with, and the session's ``tool_result`` says the same as there."""
    term = host.start()
    client = Raw(term.link, b"attach\n")
    try:
        assert client.shows(AGENT_PROMPT), client.text()
        client.answer(line)
        client.type("exit")
        assert client.eof.wait(20), client.text()[-500:]
    finally:
        client.close()
    assert ended_terminal(host, term.session).get("exit_status") == dollar
    [event] = host.calls(term.session, tool, "tool_result")
    assert_record(event, status=status, errno_name=errno_name, stage=stage)
    ran, _event = terminal(host, *line.split())
    assert ran.rc == dollar, ran


@needs_terminal
def test_ctrl_c_in_tsh_ends_the_tool_with_130_and_leaves_the_terminal(host: CoderHost) -> None:
    """docs/tools.md "The agent terminal": Ctrl-C while a tool runs interrupts the tool (exit
    status 130), never the terminal: tsh prompts again, the call is recorded with 130, and
    ``$?`` is 130."""
    term = host.start()
    client = Raw(term.link, b"attach\n")
    try:
        assert client.shows(AGENT_PROMPT), client.text()
        client.type("end sleep")
        assert client.shows("out sleep"), client.text()
        time.sleep(0.2)
        client.send(b"\x03")
        assert client.shows(AGENT_PROMPT, 2, 10), client.text()
        client.type("exit")
        assert client.eof.wait(20), client.text()[-500:]
    finally:
        client.close()
    assert ended_terminal(host, term.session).get("exit_status") == 130
    [event] = host.calls(term.session, "end", "tool_result")
    assert_record(event, status=130, errno_name=None, stage="exit")


@needs_terminal
def test_a_foreground_ctxterm_exits_with_the_status_of_the_last_tool(host: CoderHost) -> None:
    """docs/spec ctx.agent ``bin/ctxterm``: it stays in the foreground until tsh ends and
    exits with tsh's status: 139 after a tool killed by SIGSEGV and ``exit``."""
    session = fresh("fg")
    proc = subprocess.Popen(
        [str(host.storage / "bin" / "ctxterm"), "coder", "--session", session, "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=host.ws,
        env=host.env,
    )
    host.started.append(session)
    try:
        assert proc.stdout is not None
        facts = json.loads(proc.stdout.readline())
        client = Raw(Path(facts["socket"]), b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            client.answer("end signal SEGV")
            client.type("exit")
            assert proc.wait(timeout=20) == 139
        finally:
            client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert ended_terminal(host, session).get("exit_status") == 139
    [event] = host.calls(session, "end", "tool_result")
    assert_record(event, status=139, errno_name=None, stage="exit")


# -------------------------------------------------------------------------- an MCP server

MCP_SERVER = (
    WIRE
    + r"""
import signal
TOOLS = [{"name": name, "description": "Ends its server.", "inputSchema": {"type": "object"}}
         for name in ("exit3", "kill", "segv")]
while True:
    message = receive()
    if "id" not in message:
        continue
    ident, method = message["id"], message.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "crash", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = message["params"]["name"]
        sys.stderr.write("going down: " + name + "\n")
        sys.stderr.flush()
        if name == "exit3":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL if name == "kill" else signal.SIGSEGV)
        time.sleep(5)
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)
MCP_CASES = [
    ("crash.exit3", "exited (status 3)"),
    ("crash.kill", "was killed by SIGKILL (exit status 137)"),
    ("crash.segv", "was killed by SIGSEGV (exit status 139)"),
]


@pytest.fixture(scope="module")
def bridged(host: CoderHost) -> CoderHost:
    """Server ``crash`` projected and its three tools installed, granted to agent ``mc``,
    which sees the server's directory (read-only) where its configuration is."""
    mcp = host.top / "mcp"
    mcp.mkdir(mode=0o755)
    (mcp / "server.py").write_text(MCP_SERVER)
    (mcp / "server.py").chmod(0o644)
    config = mcp / "mcp.json"
    entry = {"command": str(PYTHON), "args": [str(mcp / "server.py")]}
    config.write_text(json.dumps({"mcpServers": {"crash": entry}}))
    config.chmod(0o644)
    out = host.top / "candidates"
    projected = subprocess.run(
        [
            str(CTXMCP),
            "project",
            "--config",
            str(config),
            "--runtime-config",
            str(config),
            "--server",
            "crash",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=host.env,
        timeout=60,
    )
    assert projected.returncode == 0, projected
    tools = [tool for tool, _ in MCP_CASES]
    for tool in tools:
        installed = host.ctx("object", "install", out / f"{tool}.manifest.json", "--tier", "system")
        assert installed.rc == 0, installed
        with (host.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow mc_t tool:{tool} execute\n")
    host.create_agent(
        {"name": "mc", "label": "mc_t", "tools": tools, "mount": [[str(mcp), str(mcp), "ro"]]}
    )
    return host


@pytest.mark.parametrize(("tool", "how"), MCP_CASES, ids=[t for t, _ in MCP_CASES])
def test_an_mcp_server_that_dies_before_answering_is_eio_naming_how_it_ended(
    bridged: CoderHost, tool: str, how: str
) -> None:
    """docs/tools.md "Installed, an MCP-backed tool is an ordinary tool" step 4: a server
    that exits or is killed before it answers fails the call at once with EIO naming how it
    ended and the tail of its stderr, exit 1, in both modes, the session and the log
    agreeing."""
    said = f"server 'crash' {how} before answering tools/call"
    ran, event = terminal(bridged, tool, "{}", agent="mc")
    assert ran.rc == 1, ran
    assert f"{tool}: EIO: {said}" in ran.err and "going down" in ran.err, ran
    # The bridge's error object went to the caller's stdout, which the runner does not read
    # in terminal mode: the call is the bridge's exit 1, without an errno.
    assert_record(event, status=1, errno_name=None, stage="exit")

    ran, frames, event = native(bridged, tool, {}, agent="mc")
    assert ran.rc == 1, ran
    result = frames[-1]
    assert_frame(result, status=1, errno_name="EIO", stage="exit")
    assert said in result["error"]["message"], result
    assert_record(event, status=1, errno_name="EIO", stage="exit")
    assert said in event["message"], event
    assert_record(log_line(bridged, tool, event["call"]), status=1, errno_name="EIO", stage="exit")
