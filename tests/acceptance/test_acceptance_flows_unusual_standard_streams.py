"""``ctx``, ``ctxmcp`` and the tools they run, started on the standard streams a demanding
user's environment may hand them (SPEC §2.4, Q-1, Q-2, Q-4, W-1, S-1, T-3, M-1, D-1;
README *Exit status*, docs/queue.md *Command line*, docs/workers.md, docs/tools.md *Agent
native mode and its frames*).

Standard output may be a pipe in ``O_NONBLOCK`` mode (its other side set it, as node and some
terminals do), a pipe whose reader is slow, a UNIX socket, a file opened ``O_APPEND`` and
locked by another process, or a file on a filesystem that fills up partway; standard error
may be closed; standard input may be a socket, ``/dev/zero``, a raw-mode terminal or a
non-blocking pipe whose writer is still writing.  Whatever it is, the user expects the whole
output (the same bytes as a normal run), the documented exit statuses (74 for an output that
fails, 141 for a reader that left), no traceback, no job published twice or lost because an
acknowledgement could not be written, no result recorded from half an input, and for
``ctx run`` the tool's output passed through whole."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import shutil
import socket
import subprocess
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    clean_env,
    new_scratch_dir,
    request,
    scratch_top,
)
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import shell_job
from tests.acceptance.workercli import storage as storage
from tests.support.mcp_wire import WIRE

SCRATCH = scratch_top(__file__)
CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
MIB = 1024 * 1024

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid and tmpfs is mounted: needs root"
)
pytestmark = needs_root

# An MCP stdio server offering many tools, so that ``ctxmcp list --json`` says well over a
# pipe's 64 KiB.
MANY_TOOLS_SERVER = (
    WIRE
    + r"""
TOOLS = [{"name": "t%04d" % i, "description": "tool number %d " % i + "d" * 200,
          "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}
         for i in range(500)]
while True:
    m = receive()
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {
            "protocolVersion": m["params"]["protocolVersion"],
            "capabilities": {"tools": {}}, "serverInfo": {"name": "many", "version": "1"}}})
    elif m["method"] == "tools/list":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": TOOLS}})
    else:
        send({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "no"}})
"""
)


# ------------------------------------------------------------------------------ helpers


@dataclass
class Ran:
    rc: int
    out: bytes
    err: str

    def __repr__(self) -> str:
        tail = self.out[-200:]
        return f"exit {self.rc}\nstdout: {len(self.out)} bytes {tail!r}\nstderr: {self.err!r}"


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = new_scratch_dir(SCRATCH, "s")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def env_of(storage: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage))


def normal(argv: list[str], env: dict[str, str], stdin: bytes = b"") -> Ran:
    """``argv`` with ordinary pipes: what a user compares every other run with."""
    proc = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=60)
    return Ran(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def _set_nonblocking(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


def _fill(fd: int) -> int:
    """Write into the non-blocking pipe ``fd`` until it holds no more; how much it took."""
    total = 0
    try:
        while True:
            total += os.write(fd, b"x" * 4096)
    except BlockingIOError:
        return total


def through_pipe(
    argv: list[str],
    env: dict[str, str],
    *,
    nonblocking: bool,
    room: int | None = None,
    stdin=subprocess.DEVNULL,
    first_read_after: float = 0.3,
    start_when: Callable[[], bool] | None = None,
) -> Ran:
    """``argv`` with standard output a pipe (``O_NONBLOCK`` when ``nonblocking``, as the
    other side may set it) whose reader is slow: it starts reading after
    ``first_read_after`` seconds and then takes 4 KiB at a time with a pause between reads.
    With ``room``, the pipe is filled first and only ``room`` bytes read back out of it, so
    that the command finds a pipe that takes little; the filler is left out of ``out``.
    With ``start_when``, the reader waits (``first_read_after`` seconds at most, less if the
    command ends) until it holds, then a moment more, before its first read."""
    r, w = os.pipe()
    filler = 0
    if nonblocking:
        _set_nonblocking(w)
    if room is not None:
        _set_nonblocking(w)
        filler = _fill(w) - room
        os.read(r, room)
        if not nonblocking:
            fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    proc = subprocess.Popen(argv, stdin=stdin, stdout=w, stderr=subprocess.PIPE, env=env)
    os.close(w)
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()))
    reader.start()
    if start_when is None:
        time.sleep(first_read_after)
    else:
        deadline = time.monotonic() + first_read_after
        while time.monotonic() < deadline and proc.poll() is None and not start_when():
            time.sleep(0.02)
        time.sleep(0.2)
    chunks = []
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        chunks.append(chunk)
        time.sleep(0.0005)
    os.close(r)
    proc.wait(timeout=60)
    reader.join()
    out = b"".join(chunks)[filler:]
    return Ran(proc.returncode, out, errors[0].decode("utf-8", "replace"))


def with_nonblocking_stdin(
    argv: list[str], env: dict[str, str], first: bytes, rest: bytes
) -> tuple[Ran, bool]:
    """``argv`` reading a non-blocking pipe whose writer sends ``first``, then ``rest`` a
    moment later, then closes it; and whether ``rest`` could still be written."""
    r, w = os.pipe()
    _set_nonblocking(r)
    os.write(w, first)
    proc = subprocess.Popen(argv, stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    os.close(r)
    time.sleep(0.6)
    try:
        os.write(w, rest)
        delivered = True
    except BrokenPipeError:
        delivered = False
    os.close(w)
    out, err = proc.communicate(timeout=60)
    return Ran(proc.returncode, out, err.decode("utf-8", "replace")), delivered


def many_jobs(queue: QueueCLI, count: int) -> list[str]:
    """``count`` jobs published in one batch, each with a long input, so that the queue's
    listings say more than a pipe holds."""
    lines = "".join(
        json.dumps(request(input={"path": f"{i:05d}-" + "p" * 150})) + "\n" for i in range(count)
    )
    r = queue.run("publish", "--batch", "-", input=lines)
    assert r.rc == 0, r
    return r.lines()


def no_traceback(ran: Ran) -> None:
    assert "Traceback" not in ran.err, ran


def ctx(*args: str) -> list[str]:
    return [*CTX_ARGV, *args]


def session_events(storage: Path, count: int) -> Path:
    """The default session of agent ``ci`` (uid 65534) holding ``count`` events."""
    directory = storage / "home" / "65534" / "agent" / "ci" / "session" / "default"
    directory.mkdir(parents=True, exist_ok=True)
    events = directory / "events.jsonl"
    with events.open("a") as f:
        for i in range(count):
            event = {
                "ts": "2026-06-22T12:00:00Z",
                "type": "tool.call",
                "agent": "ci",
                "session": "default",
                "object": "tool/fs.read",
                "status": "ok",
                "n": i,
            }
            f.write(json.dumps(event) + "\n")
    return events


BIG_OUTPUT_CMD = "head -c 1500000 /dev/zero | tr '\\0' a"


# --------------------------------------------------- ordinary but slow or odd outputs


def test_a_slow_reader_of_a_blocking_pipe_gets_the_whole_listing(queue: QueueCLI) -> None:
    many_jobs(queue, 1000)
    env = env_of(queue.storage)
    argv = ctx("queue", "list", "--project", "proj", "--json")
    expected = normal(argv, env)
    assert expected.rc == 0 and len(expected.out) > 64 * 1024, expected
    slow = through_pipe(argv, env, nonblocking=False)
    assert (slow.rc, slow.out) == (0, expected.out), slow


def test_a_unix_socket_as_standard_output_gets_the_whole_listing_and_a_leaving_reader_141(
    queue: QueueCLI,
) -> None:
    many_jobs(queue, 1000)
    env = env_of(queue.storage)
    argv = ctx("queue", "list", "--project", "proj", "--json")
    expected = normal(argv, env)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        proc = subprocess.Popen(argv, stdout=theirs, stderr=subprocess.PIPE, env=env)
        theirs.close()
        got = b""
        while chunk := ours.recv(65536):
            got += chunk
        err = proc.communicate(timeout=60)[1].decode()
    assert (proc.returncode, got, err) == (0, expected.out, ""), (proc.returncode, err)

    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        proc = subprocess.Popen(argv, stdout=theirs, stderr=subprocess.PIPE, env=env)
        theirs.close()
        assert ours.recv(100)
        ours.close()
        err = proc.communicate(timeout=60)[1].decode()
    assert (proc.returncode, err) == (141, ""), (proc.returncode, err)


def test_a_locked_file_opened_for_appending_keeps_what_it_held_and_gets_the_whole_output(
    queue: QueueCLI, scratch: Path
) -> None:
    many_jobs(queue, 300)
    env = env_of(queue.storage)
    argv = ctx("queue", "list", "--project", "proj", "--json")
    expected = normal(argv, env)
    log = scratch / "log"
    log.write_bytes(b"earlier line\n")
    holder = subprocess.Popen(["flock", str(log), "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(["flock", "-n", str(log), "true"])
            if probe.returncode != 0:
                break
            time.sleep(0.02)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            proc = subprocess.run(argv, stdout=fd, stderr=subprocess.PIPE, env=env, timeout=60)
        finally:
            os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0 and proc.stderr == b"", proc
    assert log.read_bytes() == b"earlier line\n" + expected.out


@pytest.fixture
def small_disk(scratch: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a file written there runs out of room partway."""
    where = scratch / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_an_output_file_that_fills_partway_ends_with_74_and_says_what_was_published(
    queue: QueueCLI, small_disk: Path
) -> None:
    env = env_of(queue.storage)
    many_jobs(queue, 1000)
    with open(small_disk / "list", "wb") as out:
        listing = subprocess.run(
            ctx("queue", "list", "--project", "proj", "--json"),
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
            timeout=60,
        )
    err = listing.stderr.decode()
    assert listing.returncode == 74 and "ENOSPC: cannot write standard output" in err, err
    assert "Traceback" not in err

    before = set(queue.entries("pending"))
    lines = "".join(json.dumps(request(n=i)) + "\n" for i in range(2000))
    with open(small_disk / "names", "wb") as out:
        batch = subprocess.run(
            ctx("queue", "publish", "--project", "proj", "--batch", "-"),
            input=lines.encode(),
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
            timeout=60,
        )
    err = batch.stderr.decode()
    published = set(queue.entries("pending")) - before
    assert batch.returncode == 74 and "do not publish again" in err, err
    assert len(published) == 2000
    assert all(name in err for name in published)


def test_closed_standard_error_leaves_standard_output_and_the_status_as_they_are(
    queue: QueueCLI,
) -> None:
    many_jobs(queue, 50)
    env = env_of(queue.storage)
    argv = ctx("queue", "list", "--project", "proj", "--json")
    expected = normal(argv, env)
    quiet = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    closed = subprocess.run(
        ["sh", "-c", '"$@" 2>&-', "sh", *argv], stdout=subprocess.PIPE, env=env, timeout=60
    )
    assert (closed.returncode, closed.stdout) == (0, expected.out) == (0, quiet.stdout)
    refused = subprocess.run(
        ["sh", "-c", '"$@" 2>&-', "sh", *ctx("queue", "show", "--project", "proj", "nosuch")],
        stdout=subprocess.PIPE,
        env=env,
        timeout=60,
    )
    assert refused.returncode == 1 and refused.stdout == b""


# ------------------------------------------------------------------- unusual inputs


def test_endless_standard_input_is_refused_at_its_limit_and_changes_nothing(
    queue: QueueCLI, agent: str
) -> None:
    env = env_of(queue.storage)
    job = queue.publish()
    assert queue.claim() == job
    before = {sub: queue.entries(sub) for sub in ("pending", "claimed", "done", "failed")}
    commands = {
        "publish": ctx("queue", "publish", "--project", "proj", "-"),
        "batch": ctx("queue", "publish", "--project", "proj", "--batch", "-"),
        "finish": ctx("queue", "finish", "--project", "proj", job, "--ok", "-"),
        "run": ctx("run", "--agent", agent, "--native", "shell.exec"),
    }
    for what, argv in commands.items():
        with open("/dev/zero", "rb") as zero:
            proc = subprocess.run(argv, stdin=zero, capture_output=True, env=env, timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 1, (what, err)
        assert "EFBIG" in err or "EINVAL" in err, (what, err)
        assert "Traceback" not in err, (what, err)
    after = {sub: queue.entries(sub) for sub in ("pending", "claimed", "done", "failed")}
    assert after == before
    assert queue.state(job) == "claimed"


def test_a_request_read_from_a_socket_is_published_whole(queue: QueueCLI) -> None:
    env = env_of(queue.storage)
    req = request(input={"path": "x" * 100_000})
    ours, theirs = socket.socketpair()
    with ours, theirs:
        proc = subprocess.Popen(
            ctx("queue", "publish", "--project", "proj", "-"),
            stdin=theirs,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        theirs.close()
        ours.sendall(json.dumps(req).encode())
        ours.shutdown(socket.SHUT_WR)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    job = out.decode().strip()
    assert json.loads((queue.dir / "pending" / job).read_bytes())["input"] == req["input"]


def test_a_raw_mode_terminal_as_standard_input_is_left_in_its_modes(queue: QueueCLI) -> None:
    env = env_of(queue.storage)
    queue.publish()
    controller, terminal = pty.openpty()
    try:
        tty.setraw(terminal)
        modes = termios.tcgetattr(terminal)
        for argv in (
            ctx("queue", "status", "--project", "proj", "--json"),
            ctx("queue", "list", "--project", "proj"),
        ):
            proc = subprocess.run(argv, stdin=terminal, capture_output=True, env=env, timeout=60)
            assert proc.returncode == 0, proc
            assert termios.tcgetattr(terminal) == modes
    finally:
        os.close(terminal)
        os.close(controller)


# ------------------------------------------------------------------------- ctx run


def test_ctx_run_passes_megabytes_through_a_slow_reader_in_both_modes(
    storage: Path, agent: str
) -> None:
    env = env_of(storage)
    payload = json.dumps({"cmd": BIG_OUTPUT_CMD})
    terminal = through_pipe(
        ctx("run", "--agent", agent, "shell.exec", payload), env, nonblocking=False
    )
    assert terminal.rc == 0, terminal
    assert hashlib.sha256(terminal.out).hexdigest() == hashlib.sha256(b"a" * 1_500_000).hexdigest()

    with open(Path(storage).parent / "input.json", "w") as f:
        f.write(payload)
    with open(Path(storage).parent / "input.json", "rb") as stdin:
        native = through_pipe(
            ctx("run", "--agent", agent, "--native", "shell.exec"),
            env,
            nonblocking=False,
            stdin=stdin,
        )
    assert native.rc == 0, native
    frames = [json.loads(line) for line in native.out.splitlines()]
    assert [f["type"] for f in frames] == ["call", "result"]
    assert frames[-1]["output"] == "a" * 1_500_000


# ------------------------------------------------ non-blocking standard output


def test_a_nonblocking_pipe_gets_the_whole_listing(queue: QueueCLI) -> None:
    many_jobs(queue, 1000)
    env = env_of(queue.storage)
    argv = ctx("queue", "list", "--project", "proj", "--json")
    expected = normal(argv, env)
    slow = through_pipe(argv, env, nonblocking=True)
    no_traceback(slow)
    assert (slow.rc, slow.out) == (0, expected.out), slow


def test_a_claim_whose_name_a_full_nonblocking_pipe_refuses_names_the_job(
    queue: QueueCLI,
) -> None:
    job = queue.publish()
    claim = through_pipe(
        ctx("queue", "claim", "--project", "proj"),
        env_of(queue.storage),
        nonblocking=True,
        room=0,
        first_read_after=10,
        start_when=lambda: queue.state(job) == "claimed",
    )
    no_traceback(claim)
    assert queue.state(job) == "claimed"  # the claim was made
    # Either the name was delivered once the reader read, or the command said it could
    # not write it and named the job it leased, as with a full disk.
    delivered = claim.rc == 0 and claim.out.decode().strip() == job
    reported = claim.rc == 74 and job in claim.err
    assert delivered or reported, claim


def test_a_batch_on_a_nonblocking_pipe_names_every_job_it_published(queue: QueueCLI) -> None:
    lines = "".join(json.dumps(request(n=i)) + "\n" for i in range(2000))
    with open(queue.storage.parent / "batch.jsonl", "w") as f:
        f.write(lines)
    with open(queue.storage.parent / "batch.jsonl", "rb") as stdin:
        batch = through_pipe(
            ctx("queue", "publish", "--project", "proj", "--batch", "-"),
            env_of(queue.storage),
            nonblocking=True,
            stdin=stdin,
            room=0,
            first_read_after=10,
            start_when=lambda: len(queue.entries("pending")) == 2000,
        )
    no_traceback(batch)
    published = queue.entries("pending")
    assert len(published) == 2000
    if batch.rc == 0:
        assert set(batch.out.decode().split()) == published, batch
    else:
        assert batch.rc == 74 and "do not publish again" in batch.err, batch


def test_a_finish_on_a_full_nonblocking_pipe_says_the_job_was_finished(
    queue: QueueCLI, scratch: Path
) -> None:
    job = queue.publish()
    assert queue.claim() == job
    result_file = scratch / "result.json"
    result_file.write_text('{"answer": 42}')
    finish = through_pipe(
        ctx("queue", "finish", "--project", "proj", job, "--ok", str(result_file)),
        env_of(queue.storage),
        nonblocking=True,
        room=0,
    )
    no_traceback(finish)
    assert queue.state(job) == "done"
    assert finish.rc == 0 or (finish.rc == 74 and "do not finish it again" in finish.err), finish


def test_session_show_of_many_events_reaches_a_nonblocking_pipe_whole(
    storage: Path, agent: str
) -> None:
    session_events(storage, 1500)
    env = env_of(storage)
    for argv in (
        ctx("session", "show", agent, "--json"),
        ctx("session", "tail", agent, "-n", "1500"),
    ):
        expected = normal(argv, env)
        assert expected.rc == 0 and len(expected.out) > 64 * 1024, expected
        slow = through_pipe(argv, env, nonblocking=True)
        no_traceback(slow)
        assert (slow.rc, slow.out) == (0, expected.out), (argv, slow)


def test_ctx_run_native_on_a_nonblocking_pipe_delivers_its_frames(
    storage: Path, agent: str
) -> None:
    env = env_of(storage)
    with open(storage.parent / "input.json", "w") as f:
        f.write(json.dumps({"cmd": BIG_OUTPUT_CMD}))
    with open(storage.parent / "input.json", "rb") as stdin:
        native = through_pipe(
            ctx("run", "--agent", agent, "--native", "shell.exec"),
            env,
            nonblocking=True,
            stdin=stdin,
        )
    no_traceback(native)
    assert native.rc == 0, native
    assert json.loads(native.out.splitlines()[-1])["output"] == "a" * 1_500_000


def test_a_worker_whose_nonblocking_output_fills_stops_as_documented(
    queue: QueueCLI, agent: str
) -> None:
    lines = "".join(json.dumps(shell_job("true")) + "\n" for i in range(25))
    r = queue.run("publish", "--batch", "-", input=lines)
    assert r.rc == 0, r
    work = through_pipe(
        ctx("queue", "work", "--project", "proj", "--agent", agent, "--drain", "--json"),
        env_of(queue.storage),
        nonblocking=True,
        room=4096,
        first_read_after=1.5,
        start_when=lambda: False,
    )
    no_traceback(work)
    # Nothing lost or run twice, whatever the output did.
    for job, states in queue.requests().items():
        assert len(states) == 1 and states[0] in ("pending", "done", "failed"), (job, states)
    assert work.rc != 1, work
    assert work.rc in (0, 74), work


def test_ctxmcp_list_reaches_a_nonblocking_pipe_whole(scratch: Path) -> None:
    server = scratch / "many.py"
    server.write_text(MANY_TOOLS_SERVER)
    config = scratch / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"many": {"command": "python3", "args": [str(server)]}}})
    )
    argv = [CTXMCP, "list", "--config", str(config), "--server", "many", "--json"]
    env = clean_env()
    expected = normal(argv, env)
    assert expected.rc == 0 and len(expected.out) > 64 * 1024, expected
    slow = through_pipe(argv, env, nonblocking=True)
    no_traceback(slow)
    assert (slow.rc, slow.out) == (0, expected.out), slow


def test_ctx_man_reaches_a_nonblocking_pipe_whole(storage: Path) -> None:
    env = env_of(storage)
    argv = ctx("man", "tool")
    expected = normal(argv, env)
    assert expected.rc == 0 and len(expected.out) > 8192, expected
    slow = through_pipe(argv, env, nonblocking=True, room=4096)
    no_traceback(slow)
    assert (slow.rc, slow.out) == (0, expected.out), slow


# ------------------------------------------------- non-blocking standard input


def test_a_batch_from_a_nonblocking_stdin_publishes_every_line_or_none(queue: QueueCLI) -> None:
    line = (json.dumps(request()) + "\n").encode()
    batch, _ = with_nonblocking_stdin(
        ctx("queue", "publish", "--project", "proj", "--batch", "-"),
        env_of(queue.storage),
        line * 3,
        line * 3,
    )
    no_traceback(batch)
    published = queue.entries("pending")
    assert (batch.rc, len(published)) in ((0, 6), (1, 0)), (batch, published)


def test_a_result_from_a_nonblocking_stdin_is_recorded_whole_or_not_at_all(
    queue: QueueCLI,
) -> None:
    job = queue.publish()
    assert queue.claim() == job
    finish, _ = with_nonblocking_stdin(
        ctx("queue", "finish", "--project", "proj", job, "--ok", "-"),
        env_of(queue.storage),
        b"first half of the output, ",
        b"second half\n",
    )
    no_traceback(finish)
    if queue.state(job) == "claimed":  # refused: the job may be finished again
        assert finish.rc == 1, finish
        return
    assert finish.rc == 0, finish
    recorded = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert recorded["output"] == "first half of the output, second half\n"
