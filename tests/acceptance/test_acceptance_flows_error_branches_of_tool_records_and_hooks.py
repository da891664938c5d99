"""The error branches of a tool call's records and hooks, each reached from outside through
``ctx run`` (terminal and ``--native`` modes) and ``ctx queue work``: the tool's log as the
call's result is recorded, the session's line beside it, the hooks around the tool, and the
``status`` control the call is admitted by.

Sources: SPEC T-1, T-3, T-5, T-6, T-7, S-2, S-4, S-5; docs/tools.md ("A tool on disk",
"Running a tool": the stages ``hook``, ``run`` and ``record`` and the paragraphs after the
stage table, "Hooks", "How an install stays atomic"); docs/sessions.md ("Appending,
crash-safely", "Reading, torn lines and repair"); docs/workers.md (a call its records refuse).

The angle: the code that records a result (``cortexfs/tools/record.py``), reads the controls
(``cortexfs/tools/controls.py``), carries a log over a reinstall (``cortexfs/tools/pairs.py``)
and runs the hooks (``cortexfs/tools/hooks.py``, the hook handling of
``cortexfs/tools/runner.py``), read branch by branch and driven the way an operator meets
them: a log that ends with a torn line while it is append-only or kept locked, that sits on a
read-only mount, a full filesystem or past the file-size limit, that is sparse to gigabytes,
that is a link, a directory, a socket or a FIFO, that has a second name during an install or
beside a lock nobody installs under, that is removed or swapped while the tool runs; a
session pinned or swapped for a link while the call runs; hooks on a ``noexec`` mount, hooks
that cannot be started for want of descriptors, post-hooks whose working directory is gone;
a ``status`` control with odd bytes.  Each check reads the exit status, the errno word of
the ``ctx: ERRNO: …`` line or of the native ``result`` frame, that the message names the file
or hook at fault and the remedy the documents promise, that no traceback is printed, and that
nothing is half-done: the log and the session byte for byte as they should be, no file
written through a link, no tool run that was refused, no line lost."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    ctx_run,
    limited,
    new_scratch_dir,
    request,
    scratch_top,
    wait_for,
)
from tests.support.storage import attribute, copy_of_root

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid, and mounts need root"
)

TOP = scratch_top(__file__)
AGENT = "coder"
LABEL = "coder_t"
# The tools every world holds.  ``t`` leaves ``ran-t`` in the agent's working directory (the
# workspace), so that a refused call provably ran nothing; ``wait`` marks that it started and
# runs until the test lets it go (``go``) or takes its mark away (``started``), so that the
# test changes the records while the tool runs; ``off`` is disabled (refused at stage
# ``resolve``, before any process starts); ``bare`` has no hook ever.
PROGRAMS = {
    "t": '#!/bin/sh\ntouch ran-t\necho "t $*"\n',
    "wait": (
        "#!/bin/sh\ntouch started\n"
        'while [ ! -e go ] && [ -e started ]; do sleep 0.02; done\necho "waited"\n'
    ),
    "off": "#!/bin/sh\ntouch ran-off\n",
    "bare": "#!/bin/sh\ntouch ran-bare\necho bare\n",
}
# A last line a crash cut short: no newline, and no whole event.
TORN = b'{"ts":"2026-12-01T00:00:00Z","type":"tool_result","agent":"co'
TRACEBACK = "Traceback (most recent call last)"


def manifest_of(name: str) -> dict:
    return {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": f"{name}.prog",
    }


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root holding the tools of :data:`PROGRAMS` in the system tier, allowed
    to agent ``coder`` (label ``coder_t``, running as ``nobody``) in both layers of P-6, the
    space ``proj`` (for a worker), and the agent's workspace ``ws``, its first mount and its
    working directory."""

    top: Path
    storage: Path
    ws: Path
    manifests: Path
    uid: int = 0

    def native(self, tool: str, data: str = "{}", *options: str, **kw) -> Run:
        return self.ctx("run", "--agent", AGENT, "--native", *options, tool, input=data, **kw)

    def terminal(self, tool: str, *argv: str, options: tuple[str, ...] = (), **kw) -> Run:
        return self.ctx("run", "--agent", AGENT, *options, tool, *argv, **kw)

    def started(self, tool: str, data: str = "{}") -> subprocess.Popen:
        """A native call of ``tool`` left running; :func:`ended` collects it."""
        proc = subprocess.Popen(
            [*CTX_ARGV, "run", "--agent", AGENT, "--native", "--timeout", "60", tool],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        assert proc.stdin is not None
        proc.stdin.write(data.encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    def controls(self, tool: str) -> Path:
        return self.storage / "tool" / f"{tool}.d"

    def log(self, tool: str = "t") -> Path:
        return self.controls(tool) / "log"

    def logged(self, tool: str = "t") -> list[dict]:
        """The whole lines of the tool's log (a torn last line is no event)."""
        return whole_events(self.log(tool))

    def session_file(self, session: str = "default") -> Path:
        home = self.storage / "home" / str(self.uid) / "agent" / AGENT / "session"
        return home / session / "events.jsonl"

    def events(self, session: str = "default") -> list[dict]:
        return whole_events(self.session_file(session))

    def results(self, session: str = "default") -> dict[str, dict]:
        """The session's ``tool_result`` events by call id."""
        return {e["call"]: e for e in self.events(session) if e["type"] == "tool_result"}

    def hook(self, tool: str, phase: str, name: str, body: str) -> Path:
        """A hook of root's, mode 0755, as the administrator writes one."""
        path = self.controls(tool) / "hooks" / f"{phase}.d" / name
        path.write_text(body)
        path.chmod(0o755)
        return path

    def ran(self, tag: str = "t") -> bool:
        return (self.ws / f"ran-{tag}").exists()


def whole_events(path: Path) -> list[dict]:
    """The events of the whole lines of ``path``; none when there is no file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def result_frame(run: Run) -> dict:
    """The last frame of a native call: its ``result``, never a traceback beside it."""
    assert TRACEBACK not in run.err, run
    printed = frames(run)
    assert printed and printed[-1]["type"] == "result", run
    return printed[-1]


def refused(run: Run, errno_word: str, status: int) -> str:
    """The one ``ctx: ERRNO: sentence`` line of a terminal call that exited ``status``: its
    sentence."""
    assert run.rc == status and TRACEBACK not in run.err, run
    line = run.err.strip().splitlines()[-1]
    assert line.startswith(f"ctx: {errno_word}: "), run
    return line.removeprefix(f"ctx: {errno_word}: ")


def ended(proc: subprocess.Popen, timeout: float = 60) -> Run:
    out, err = proc.communicate(timeout=timeout)
    return Run(["run", "…"], proc.returncode, out.decode(), err.decode())


def grant(policy: Path, tool: str) -> None:
    with policy.open("a") as rules:
        rules.write(f"allow {LABEL} tool:{tool} execute\n")


@pytest.fixture(scope="session")
def template() -> Iterator[World]:
    """Per test process: ``ctx bootstrap``, ``ctx agent create``, ``ctx shared create`` and
    the installs once; each test works on a copy."""
    top = new_scratch_dir(TOP, "template-")
    ws, manifests = top / "ws", top / "m"
    ws.mkdir()
    manifests.mkdir()
    w = World(top, top / "storage", ws, manifests)
    made = ctx_run("bootstrap", "--storage", w.storage)
    assert made.rc == 0, made
    agent = w.create_agent(
        {"name": AGENT, "label": LABEL, "mount": [[str(ws), "/workspace", "rw"]]}
    )
    w.uid = agent["identity"]["uid"]
    space = w.ctx("shared", "create", "proj")
    assert space.rc == 0, space
    for name, program in PROGRAMS.items():
        (manifests / f"{name}.prog").write_text(program)
        path = manifests / f"{name}.json"
        path.write_text(json.dumps(manifest_of(name)))
        installed = w.ctx("object", "install", path, "--tier", "system")
        assert installed.rc == 0, installed
        grant(w.controls(name) / "policy", name)
        grant(w.storage / "agent" / f"{AGENT}.d" / "policy", name)
    w.controls("off").joinpath("status").write_text("disabled\n")
    yield w
    shutil.rmtree(top, ignore_errors=True)


def _mounts_below(top: Path) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        points = [line.split()[4] for line in table]
    return sorted((p for p in points if p.startswith(f"{top}/")), key=len, reverse=True)


@pytest.fixture
def world(template: World) -> Iterator[World]:
    """A copy of the template's root, the agent's mounts pointed at a workspace of its own
    (as docs/policy.md says to do for a root copied elsewhere); whatever a test left mounted
    or pinned below it is undone after."""
    top = new_scratch_dir(TOP, "w-")
    storage = copy_of_root(template.storage, top / "storage")
    ws = top / "ws"
    ws.mkdir()
    ws.chmod(0o777)
    mount = storage / "agent" / f"{AGENT}.d" / "mount"
    mount.write_text(json.dumps([[str(ws), "/workspace", "rw"], [str(storage), "/ctx", "ro"]]))
    entry = storage / "agent" / AGENT
    entry.write_text(entry.read_text().replace(str(template.storage), str(storage)))
    try:
        yield World(top, storage, ws, template.manifests, template.uid)
    finally:
        for point in _mounts_below(top):
            subprocess.run(["umount", "-l", point], check=False)
        subprocess.run(["chattr", "-R", "-i", "-a", str(top)], capture_output=True, check=False)
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def mounted(*argv: str) -> Iterator[None]:
    """``mount ARGV…`` for the block (its last word the mount point), skipped where no mount
    can be made here."""
    made = subprocess.run(["mount", *argv], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", argv[-1]], check=False)


@contextlib.contextmanager
def held_lock(path: Path, kind: int = fcntl.LOCK_EX) -> Iterator[None]:
    """An ``flock`` of ``path`` held by a process of its own for the block, as any process
    that opened the file may hold one."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, {kind})\n"
            "print('held', flush=True)\ntime.sleep(120)\n",
            str(path),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        yield
    finally:
        holder.kill()
        holder.wait()


def with_torn_line(log: Path) -> bytes:
    """``log`` ending with :data:`TORN`, as a crash leaves it; its bytes."""
    with log.open("ab") as opened:
        opened.write(TORN)
    return log.read_bytes()


# ========================================================= the tool's log at record time


def test_a_torn_append_only_log_fails_the_call_at_stage_record_naming_the_attribute(world):
    """docs/tools.md stage ``record`` (``EPERM``…: the call is an error whatever the tool did,
    its output and exit status kept; terminal mode exit 1), docs/sessions.md "Reading, torn
    lines and repair" (the next appender cuts a torn line before it appends; an append-only
    file refuses the cut, to root too, and no event is appended after a torn line): a tool's
    log that ends torn and is ``chattr +a`` cannot take the call's line.  The call must say
    so, naming the log and the ``chattr`` that lifts the attribute, the session holding it;
    once lifted, the next call cuts the fragment and is logged."""
    log = world.log()
    before = with_torn_line(log)
    with attribute(log, "a"):
        native = world.native("t")
        term = world.terminal("t", "x")
        assert log.read_bytes() == before
    frame = result_frame(native)
    assert native.rc == 1 and frame["status"] == "error", native
    assert (frame["exit_status"], frame["output"]) == (0, "t \n"), frame
    error = frame["error"]
    assert (error["error"], error["stage"]) == ("EPERM", "record"), frame
    assert str(log) in error["message"] and "chattr -i -a" in error["message"], error
    assert f"session {frame['session']} holds it" in error["message"], error
    assert frame["call"] in world.results()
    message = refused(term, "EPERM", 1)
    assert term.out == "t x\n" and str(log) in message, term
    again = world.native("t")
    assert again.rc == 0, again
    assert [e["call"] for e in world.logged()][-1] == result_frame(again)["call"]


def test_an_append_only_log_without_a_torn_line_takes_every_call(world):
    """docs/sessions.md "Appending, crash-safely": an append is one ``write`` on an
    ``O_APPEND`` descriptor, which an append-only file (``chattr +a``) allows, to root as to
    anyone: with no torn line to cut, calls in both modes are logged, each once, and what
    the log held stays as it was before them."""
    log = world.log()
    before = log.read_bytes()
    with attribute(log, "a"):
        native = world.native("t")
        term = world.terminal("t", "x")
    assert native.rc == 0 and (term.rc, term.out) == (0, "t x\n"), (native, term)
    data = log.read_bytes()
    assert data.startswith(before) and data.count(b"\n") == before.count(b"\n") + 2
    calls = [e["call"] for e in world.logged()[-2:]]
    assert calls[0] == result_frame(native)["call"] and calls == list(world.results())[-2:]


def test_a_worker_whose_tool_log_refuses_the_cut_leaves_the_job_claimed(world):
    """docs/tools.md stage ``record``: "A worker finishes no job on such an error: the job is
    left claimed for ``ctx queue recover`` and the worker stops" — here the error is the
    tool's log that ends torn and is append-only, which cannot take the call's line."""
    queue = QueueCLI(world.storage, "proj")
    job = queue.publish(request("t", input={}), name="logged")
    log = world.log()
    before = with_torn_line(log)
    with attribute(log, "a"):
        r = queue.run("work", "--agent", AGENT, "--drain", "--json", timeout=60)
        assert log.read_bytes() == before
    assert TRACEBACK not in r.err, r
    assert queue.state(job) == "claimed", (r, queue.state(job))
    assert r.rc == 1 and json.loads(r.out.splitlines()[-1])["error"] == "EPERM", r


def test_a_torn_log_kept_locked_fails_the_call_with_eagain_at_stage_record(world):
    """docs/sessions.md "Appending, crash-safely" (an append waits at most 10 s for a log
    another process keeps locked, then EAGAIN naming it and 'fuser'), docs/tools.md stage
    ``record``: the same holds when the log ends torn, whose cut waits for the same lock —
    the call must not end ``ok`` with its result in no log."""
    log = world.log()
    before = with_torn_line(log)
    with held_lock(log):
        native = world.native("t", timeout=90)
        assert log.read_bytes() == before
    frame = result_frame(native)
    assert native.rc == 1 and frame["status"] == "error", native
    error = frame["error"]
    assert (error["error"], error["stage"]) == ("EAGAIN", "record"), frame
    assert str(log) in error["message"] and "fuser" in error["message"], error


def test_a_log_kept_locked_fails_the_call_with_eagain_naming_it_and_fuser(world):
    """docs/sessions.md "Appending, crash-safely", docs/tools.md stage ``record``: a tool's
    log another process keeps locked is waited for 10 s, then the call is an error at stage
    ``record`` (EAGAIN, naming the log and 'fuser'), the tool's output and exit status kept
    and the session holding the call; the log is as it was, and the next call is logged."""
    log = world.log()
    before = log.read_bytes()
    started = time.monotonic()
    with held_lock(log):
        native = world.native("t", timeout=60)
        assert log.read_bytes() == before
    took = time.monotonic() - started
    frame = result_frame(native)
    assert native.rc == 1 and 9 <= took < 40, (native, took)
    assert (frame["exit_status"], frame["output"]) == (0, "t \n"), frame
    error = frame["error"]
    assert (error["error"], error["stage"]) == ("EAGAIN", "record"), frame
    assert f"{log} stayed locked by another process for 10 s" in error["message"], error
    assert "find it with 'fuser'" in error["message"], error
    assert f"session {frame['session']} holds it" in error["message"], error
    assert world.results()[frame["call"]]["status"] == "ok"
    again = world.native("t")
    assert again.rc == 0 and world.logged()[-1]["call"] == result_frame(again)["call"]


def test_a_log_on_a_read_only_mount_is_erofs_at_stage_record_and_the_session_holds_it(world):
    """docs/tools.md stage ``record`` (``EROFS``…): the control directory bind-mounted
    read-only still admits the call (its controls are read, not written), the tool runs, and
    its result cannot be logged: EROFS naming the log, output and exit status kept, exit 1
    in terminal mode for a tool that exited 0; the session holds both calls."""
    controls = world.controls("t")
    before = world.log().read_bytes()
    with mounted("--bind", str(controls), str(controls)):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(controls)], check=True)
        native = world.native("t")
        term = world.terminal("t", "x")
    frame = result_frame(native)
    assert native.rc == 1 and (frame["exit_status"], frame["output"]) == (0, "t \n"), native
    error = frame["error"]
    assert (error["error"], error["stage"]) == ("EROFS", "record"), frame
    assert f"cannot open the tool's log {world.log()}" in error["message"], error
    assert f"session {frame['session']} holds it" in error["message"], error
    message = refused(term, "EROFS", 1)
    assert term.out == "t x\n" and message.startswith("the tool exited 0, but its result"), term
    assert world.log().read_bytes() == before
    calls = [e for e in world.events() if e["type"] == "tool_result"]
    assert [e["status"] for e in calls[-2:]] == ["ok", "ok"], calls
    assert frame["call"] == calls[-2]["call"]


def test_a_log_on_a_full_filesystem_is_enospc_at_stage_record_and_left_whole(world):
    """docs/tools.md stage ``record`` (``ENOSPC``): a log whose filesystem is full (here a
    small tmpfs, the log a bind mount of a file of it that fills its last page) refuses the
    call's line: the call is an error, ENOSPC naming the log, the session holding it; no
    partial line is left in the log."""
    disk = world.top / "disk"
    disk.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)):
        head = b'{"ts":"2026-12-01T00:00:00Z","type":"pad","p":"'
        kept = disk / "log"
        kept.write_bytes(head + b"x" * (4096 - len(head) - 3) + b'"}\n')
        subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'fill'}", "bs=4k"], capture_output=True)
        with mounted("--bind", str(kept), str(world.log())):
            native = world.native("t")
            assert kept.stat().st_size == 4096
        frame = result_frame(native)
        assert native.rc == 1 and frame["exit_status"] == 0, native
        error = frame["error"]
        assert (error["error"], error["stage"]) == ("ENOSPC", "record"), frame
        assert str(world.log()) in error["message"], error
        assert f"session {frame['session']} holds it" in error["message"], error
    assert frame["call"] in world.results()


def test_a_log_past_the_file_size_limit_is_efbig_and_its_torn_tail_cut_by_the_next_call(world):
    """docs/tools.md stage ``record``, S-5: a ``ctx run`` under a file-size limit the log has
    reached writes part of its line (the kernel's short write) and says EFBIG naming the
    log, the session holding the call; readers skip that torn tail, and the next call's
    append cuts it before writing, so no fragment is glued to a whole event."""
    log = world.log()
    with log.open("ab") as grown:
        line = b'{"ts":"2026-12-01T00:00:00Z","type":"pad"}\n'
        grown.write(line * 20000)
    size = log.stat().st_size
    cut = limited(world.env, "run", "--agent", AGENT, "--native", "t", input="{}", fsize=size + 10)
    frame = result_frame(cut)
    assert cut.rc == 1 and frame["exit_status"] == 0, cut
    error = frame["error"]
    assert (error["error"], error["stage"]) == ("EFBIG", "record"), frame
    assert str(log) in error["message"], error
    assert frame["call"] in world.results()
    assert log.stat().st_size == size + 10 and not log.read_bytes().endswith(b"\n")
    again = world.native("t")
    assert again.rc == 0, again
    data = log.read_bytes()
    assert data.endswith(b"\n") and len(data.splitlines()) == 20001
    assert json.loads(data.splitlines()[-1])["call"] == result_frame(again)["call"]


def test_a_sparse_log_of_gigabytes_is_cut_back_to_its_last_line_in_a_moment(world):
    """S-5, docs/sessions.md: a log grown sparse to 8 GiB (``truncate -s 8G``: a hole with no
    newline after its last whole line) ends with a torn line; the call's append cuts it back
    to that line in well under a second's work, never reading the hole, and appends."""
    log = world.log()
    first = world.native("t")
    assert first.rc == 0, first
    whole = log.read_bytes()
    os.truncate(log, 8 << 30)
    started = time.monotonic()
    again = world.native("t")
    took = time.monotonic() - started
    assert again.rc == 0 and took < 10, (again, took)
    data = log.read_bytes()
    assert data.startswith(whole) and data.count(b"\n") == whole.count(b"\n") + 1
    assert json.loads(data.splitlines()[-1])["call"] == result_frame(again)["call"]


def _plant(kind: str, path: Path, outside: Path) -> None:
    """``kind`` at ``path`` (which must not exist)."""
    if kind == "symlink":
        path.symlink_to(outside)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        # Bound under a short name (a socket's path is at most 107 bytes), then moved.
        short = new_scratch_dir(TOP, "s-") / "s"
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(short))
        os.rename(short, path)
        shutil.rmtree(short.parent)


@pytest.mark.parametrize("kind", ["symlink", "directory", "socket"])
def test_a_log_that_is_no_regular_file_damages_the_tool_until_moved_and_reinstalled(world, kind):
    """docs/tools.md "A tool on disk": the ``log`` is a control; one that is not a regular
    file makes the tool damaged (ENOEXEC at stage ``resolve``, naming it and the reinstall;
    exit 126), nothing run and no log made up, nothing written through a link.  "How an
    install stays atomic": the reinstall refuses what is not its own (EEXIST for a link or a
    special file, EISDIR for a directory), naming it, and changes nothing; moved away, the
    reinstall makes a new log and the call is logged there."""
    outside = world.top / "outside"
    outside.write_text("the administrator's\n")
    log = world.log()
    log.unlink()
    _plant(kind, log, outside)
    term = world.terminal("t", "x")
    message = refused(term, "ENOEXEC", 126)
    assert "t.d/log is" in message and "ctx object install MANIFEST --tier system" in message
    native = world.native("t")
    frame = result_frame(native)
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("ENOEXEC", "resolve"), frame
    assert not world.ran() and outside.read_text() == "the administrator's\n"
    manifest = world.manifests / "t.json"
    again = world.ctx("object", "install", manifest, "--tier", "system")
    word = "EISDIR" if kind == "directory" else "EEXIST"
    assert again.rc == 1 and again.err.startswith(f"ctx: {word}: {log} is "), again
    assert "move it away and install again" in again.err, again
    assert os.path.lexists(log) and outside.read_text() == "the administrator's\n"
    os.rename(log, world.top / "moved-away")
    healed = world.ctx("object", "install", manifest, "--tier", "system")
    assert healed.rc == 0, healed
    ok = world.native("t")
    assert ok.rc == 0 and world.logged()[-1]["call"] == result_frame(ok)["call"], ok


@pytest.mark.parametrize(
    ("control", "said"),
    [
        ("status", "t.d/status is missing or not a regular file"),
        ("log", "t.d/log is missing or not a regular file"),
        ("hooks/post.d", "t.d/hooks/post.d/ is missing or not a directory"),
    ],
)
def test_a_missing_control_is_damage_nothing_makes_up_and_a_reinstall_puts_back(
    world, control, said
):
    """T-1, docs/tools.md "A tool on disk": a control that is missing makes the tool damaged:
    ENOEXEC at stage ``resolve`` naming it and the reinstall (exit 126 in terminal mode),
    "no control directory or log is made up for it", nothing runs, the session records
    the refusal.  The reinstall the message names puts the control back (``status``
    ``available``, an empty log of mode 0640, ``post.d`` of mode 0755) and the tool runs
    and is logged again."""
    path = world.controls("t") / control
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    term = world.terminal("t", "x")
    message = refused(term, "ENOEXEC", 126)
    assert said in message and "'ctx object install MANIFEST --tier system'" in message, term
    frame = result_frame(world.native("t"))
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("ENOEXEC", "resolve"), frame
    assert world.results()[frame["call"]]["errno"] == "ENOEXEC"
    assert not os.path.lexists(path) and not world.ran()
    healed = world.ctx("object", "install", world.manifests / "t.json", "--tier", "system")
    assert healed.rc == 0, healed
    if control == "status":
        assert path.read_text().strip() == "available"
    elif control == "log":
        assert path.read_bytes() == b"" and path.stat().st_mode & 0o777 == 0o640
    else:
        assert path.is_dir() and path.stat().st_mode & 0o777 == 0o755
    ok = world.native("t")
    assert ok.rc == 0 and world.logged()[-1]["call"] == result_frame(ok)["call"], ok


def test_a_log_with_a_second_name_is_never_appended_to_and_the_call_stands(world):
    """docs/tools.md (after the stage table): "A log with a second name and no install of its
    tool under way … is left at once (the session still has the call)": an administrator's
    hard link to the log (``ln log log.keep``) makes no call wait or fail, and neither name
    is written to; the session has the call."""
    log = world.log()
    before = log.read_bytes()
    os.link(log, world.top / "log.keep")
    started = time.monotonic()
    native = world.native("t")
    took = time.monotonic() - started
    assert native.rc == 0 and took < 4, (native, took)
    assert log.read_bytes() == before == (world.top / "log.keep").read_bytes()
    assert result_frame(native)["call"] in world.results()


STAGED_TOKEN = "0123456789ab"


def test_a_call_ending_during_an_install_of_its_tool_waits_and_logs_into_the_kept_log(world):
    """docs/tools.md (after the stage table): a reinstall gives the log a second name for a
    moment (a hard link in its staged controls) holding the tier's install lock; a call that
    ends then waits for the install (up to 5 s), and its line goes into the log.  Played as
    an install does it: the lock held, ``.t~TOKEN~controls`` holding the second name; both
    let go after a second, the call's line is in the log, none lost."""
    tier = world.storage / "tool"
    staged = tier / f".t~{STAGED_TOKEN}~controls"
    staged.mkdir()
    os.link(world.log(), staged / "log")
    started = time.monotonic()
    with held_lock(tier / ".install-lock"):
        call = world.started("t")
        time.sleep(1.5)
        (staged / "log").unlink()
        staged.rmdir()
    run = ended(call)
    took = time.monotonic() - started
    frame = result_frame(run)
    assert run.rc == 0 and frame["status"] == "ok" and took >= 1.0, (run, took)
    assert world.logged()[-1]["call"] == frame["call"]


def test_a_log_with_a_second_name_beside_a_lock_no_install_holds_delays_no_call(world):
    """docs/tools.md: "Only an install of that tool is waited for: while the tier's lock is
    held and the tool's staged names or commit marker are in the tier"; the lock held by
    something else (``tsh.config``, a repair) with no staging of the tool: the call is not
    kept waiting, its result stands, the log with two names is left as it was."""
    log = world.log()
    before = log.read_bytes()
    os.link(log, world.top / "log.keep")
    with held_lock(world.storage / "tool" / ".install-lock"):
        started = time.monotonic()
        native = world.native("t")
        took = time.monotonic() - started
    assert native.rc == 0 and took < 4, (native, took)
    assert log.read_bytes() == before


def test_a_log_removed_while_the_tool_runs_is_no_error_and_none_is_made_up(world):
    """docs/tools.md stage ``record``: "a log removed while the tool ran is no error: a tool
    without one is damaged, refused at stage ``resolve`` before it runs"; "No control
    directory or log is made up for it": the call stands, the session has it, no log
    appears; the next call is refused ENOEXEC naming the log, nothing run."""
    call = world.started("wait")
    assert wait_for(lambda: (world.ws / "started").exists(), 20)
    world.log("wait").unlink()
    (world.ws / "go").touch()
    run = ended(call)
    frame = result_frame(run)
    assert run.rc == 0 and frame["output"] == "waited\n", run
    assert frame["call"] in world.results()
    assert not os.path.lexists(world.log("wait"))
    (world.ws / "started").unlink()
    (world.ws / "go").unlink()
    again = world.terminal("wait")
    message = refused(again, "ENOEXEC", 126)
    assert "wait.d/log is missing" in message and not (world.ws / "started").exists(), again
    assert not os.path.lexists(world.log("wait"))


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_log_swapped_while_the_tool_runs_is_never_written_through_or_waited_on(world, kind):
    """docs/tools.md "A tool on disk": every control is read — and the log appended to — without
    following a link, never waiting on a FIFO: a log the operator swaps for a link to a file
    elsewhere, a FIFO or a directory while the tool runs is not written through, the call
    ends promptly and the session has it; the next call is refused as damaged (ENOEXEC),
    naming the log."""
    outside = world.top / "outside"
    outside.write_text("the administrator's\n")
    call = world.started("wait")
    assert wait_for(lambda: (world.ws / "started").exists(), 20)
    log = world.log("wait")
    log.unlink()
    _plant(kind, log, outside)
    (world.ws / "go").touch()
    run = ended(call, timeout=30)
    frame = result_frame(run)
    assert frame["output"] == "waited\n" and frame["call"] in world.results(), run
    assert outside.read_text() == "the administrator's\n"
    if kind == "directory":
        assert os.listdir(log) == []
    again = world.native("wait")
    error = result_frame(again)["error"]
    assert (error["error"], error["stage"]) == ("ENOEXEC", "resolve"), again
    assert "wait.d/log" in error["message"], error


def test_a_session_pinned_while_the_tool_runs_still_leaves_the_call_in_the_tools_log(world):
    """docs/tools.md (after the stage table): ``tool_result`` goes to the session and to the
    tool's log, "each is written whatever became of the other": a session made immutable
    while the tool runs refuses its line (EPERM at stage ``record``, naming
    ``events.jsonl``, output and exit status kept), and the tool's log holds the call; the
    message does not claim the session holds it."""
    events = world.session_file()
    call = world.started("wait")
    assert wait_for(lambda: (world.ws / "started").exists(), 20)
    with attribute(events, "i"):
        before = events.read_bytes()
        (world.ws / "go").touch()
        run = ended(call)
        assert events.read_bytes() == before
    frame = result_frame(run)
    assert run.rc == 1 and (frame["exit_status"], frame["output"]) == (0, "waited\n"), run
    error = frame["error"]
    assert (error["error"], error["stage"]) == ("EPERM", "record"), frame
    assert str(events) in error["message"] and "holds it" not in error["message"], error
    assert frame["call"] not in world.results()
    (logged,) = [e for e in world.logged("wait") if e["call"] == frame["call"]]
    assert (logged["type"], logged["exit_status"]) == ("tool_result", 0), logged


# ====================================================================== hooks


def test_a_post_hook_whose_working_directory_vanished_is_not_said_to_be_missing(world):
    """T-6, docs/tools.md "Hooks": hooks start in the agent's working directory; "with that
    directory gone the call is refused before any pre-hook runs (ENOENT at stage run, naming
    it), not vetoed by a guard that could not start there".  After the tool ran, its
    workspace removed (the operator's ``rmdir``), a post-hook cannot start either: its entry
    must say why — the working directory that is gone — not that the hook itself is missing
    (``No such file or directory`` of a hook that is there).  The result stands."""
    post = world.hook("wait", "post", "10-audit", "#!/bin/sh\ncat >/dev/null\nexit 0\n")
    call = world.started("wait")
    assert wait_for(lambda: (world.ws / "started").exists(), 20)
    (world.ws / "started").unlink()
    world.ws.rmdir()
    run = ended(call)
    frame = result_frame(run)
    assert run.rc == 0 and frame["output"] == "waited\n", run
    assert post.exists()
    (failed,) = frame["post_hooks"]
    assert failed["hook"] == "hooks/post.d/10-audit", failed
    assert str(world.ws) in failed["message"], failed


def _limited_call(world: World, tool: str, nofile: int, *argv: str) -> Run:
    if argv:
        return limited(world.env, "run", "--agent", AGENT, tool, *argv, nofile=nofile)
    return limited(world.env, "run", "--agent", AGENT, "--native", tool, input="{}", nofile=nofile)


def _fewest_descriptors_a_record_needs(world: World) -> int:
    """The lowest limit of open files under which a call refused at stage ``resolve`` (before
    any process starts: the disabled tool ``off``) is still recorded in its tool's log: what
    the record needs, with the call's session open."""
    for nofile in range(5, 30):
        before = len(world.logged("off"))
        frame = result_frame(_limited_call(world, "off", nofile))
        if frame["error"]["stage"] == "resolve" and len(world.logged("off")) == before + 1:
            return nofile
    raise AssertionError("no limit let a refused call be recorded")


GUARD = "#!/bin/sh\ncat >/dev/null\ntouch ran-guard\nexit 0\n"


def test_a_pre_hook_the_host_has_no_descriptors_to_start_gives_no_verdict(world):
    """docs/tools.md (after the stage table): a stage that cannot judge because the host is
    short of descriptors refuses with that errno rather than with a verdict.  Under limits of
    open files too low to start the pre-hook, the call is refused EMFILE at stage ``hook``
    ("could not be started … it gave no verdict", naming 'ulimit -n'), never EACCES as if
    the guard had vetoed; the guard and the tool never ran; terminal mode exits 126, and the
    session records the refusal."""
    world.hook("t", "pre", "10-guard", GUARD)
    lowest = _fewest_descriptors_a_record_needs(world)
    vetoes, refusals = [], []
    for nofile in range(lowest, lowest + 10):
        for argv in ((), ("x",)):
            for mark in ("guard", "t"):
                (world.ws / f"ran-{mark}").unlink(missing_ok=True)
            run = _limited_call(world, "t", nofile, *argv)
            if argv:
                if run.rc == 126 and "hooks/pre.d/10-guard" in run.err:
                    refusals.append(refused(run, "EMFILE", 126))
                    assert run.out == "", run
                    assert not world.ran("guard") and not world.ran(), run
                continue
            frame = result_frame(run)
            error = frame["error"]
            if error is None or error["stage"] != "hook":
                continue
            vetoes.append(error)
            assert error["error"] == "EMFILE", frame
            assert frame["exit_status"] is None and frame["call"] in world.results()
            assert world.results()[frame["call"]]["errno"] == "EMFILE"
            assert not world.ran("guard") and not world.ran(), frame
    assert vetoes and refusals, (vetoes, refusals)
    for message in [e["message"] for e in vetoes] + refusals:
        assert message.startswith("hooks/pre.d/10-guard could not be started: "), message
        assert "ulimit -n" in message and "it gave no verdict" in message, message


@pytest.mark.parametrize("what", ["pre-hook", "tool"])
def test_a_process_not_started_for_want_of_descriptors_leaves_room_for_the_record(world, what):
    """docs/tools.md (after the stage table, stage ``record``): a call refused EMFILE because
    its pre-hook (or the tool itself) could not be started is recorded like any refused call:
    under every limit of open files at which a call refused before anything starts is logged
    in its tool's log, so is this one — no descriptor of the failed start is left behind to
    crowd the record out ("… and its result could not be recorded (EMFILE: cannot open the
    tool's log …)")."""
    tool, stage = ("t", "hook") if what == "pre-hook" else ("bare", "run")
    if what == "pre-hook":
        world.hook("t", "pre", "10-guard", GUARD)
    lowest = _fewest_descriptors_a_record_needs(world)
    refusals = 0
    for nofile in range(lowest, lowest + 10):
        before = len(world.logged(tool))
        frame = result_frame(_limited_call(world, tool, nofile))
        error = frame["error"]
        if error is None or error["stage"] != stage:
            continue
        refusals += 1
        assert error["error"] == "EMFILE", frame
        assert "could not be recorded" not in error["message"], (nofile, error)
        assert len(world.logged(tool)) == before + 1, nofile
    assert refusals, "no limit refused the start"


@contextlib.contextmanager
def noexec_pre_hooks(world: World) -> Iterator[Path]:
    """``t``'s ``hooks/pre.d`` a tmpfs of root's mounted ``noexec`` (mode 0755), holding the
    guard; its path."""
    pre = world.controls("t") / "hooks" / "pre.d"
    with mounted("-t", "tmpfs", "-o", "size=1m,mode=0755,noexec", "tmpfs", str(pre)):
        world.hook("t", "pre", "10-guard", GUARD)
        yield pre


def test_a_pre_hook_on_a_noexec_mount_vetoes_naming_the_mount(world):
    """T-5, T-6, docs/tools.md "Hooks": a hook whose execute bits are not the agent's "as the
    kernel judges them" is a failed hook, in ``pre.d`` a veto: on a filesystem mounted
    ``noexec`` the kernel executes nothing, whatever the mode.  EACCES at stage ``hook``,
    exit 126, naming the hook, the mount and remounting it with exec; neither the guard nor
    the tool ran, and the refusal is in the session and the tool's log."""
    with noexec_pre_hooks(world) as pre:
        term = world.terminal("t", "x")
        native = world.native("t")
    message = refused(term, "EACCES", 126)
    assert message.startswith("hooks/pre.d/10-guard vetoed the call (exit 126): "), term
    assert f"mounted noexec at {pre}" in message and f"remount {pre} with exec" in message
    frame = result_frame(native)
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EACCES", "hook"), frame
    assert world.logged()[-1]["call"] == frame["call"] and frame["call"] in world.results()
    assert not world.ran("guard") and not world.ran()


def test_the_remedy_for_a_hook_on_a_noexec_mount_names_the_hook_not_the_tool(world):
    """T-6, docs/tools.md "Hooks", CONVENTIONS ("a sentence a user can act on"): the remedy of
    a hook that is on a ``noexec`` filesystem is about the hook (remount its directory, or
    put the hook elsewhere), never to move the tool, which is on a filesystem mounted with
    exec and is not what the kernel refused."""
    with noexec_pre_hooks(world):
        term = world.terminal("t", "x")
    message = refused(term, "EACCES", 126)
    assert "put the tool on" not in message, message
    assert "the hook" in message.split("whatever its mode")[-1], message


def test_a_post_hook_swapping_its_session_for_a_link_is_never_written_through(world):
    """S-5, docs/tools.md: the session is the agent's, and its hooks run as the agent; a
    post-hook that moves ``events.jsonl`` aside and puts a link to a file of root's in its
    place cannot make the host write through it: the ``tool_result`` goes to the file the
    call opened (now under its new name), the file the link names is untouched, and the
    tool's log has the call."""
    rootfile = world.top / "rootfile"
    rootfile.write_text("root's own\n")
    rootfile.chmod(0o644)
    session = world.session_file().parent
    world.hook(
        "t",
        "post",
        "10-swap",
        f"#!/bin/sh\ncat >/dev/null\nmv {session}/events.jsonl {session}/moved.jsonl\n"
        f"ln -s {rootfile} {session}/events.jsonl\n",
    )
    native = world.native("t")
    frame = result_frame(native)
    assert native.rc == 0 and frame["post_hooks"] == [], native
    assert rootfile.read_text() == "root's own\n"
    assert (session / "events.jsonl").is_symlink()
    moved = whole_events(session / "moved.jsonl")
    assert [e["type"] for e in moved[-2:]] == ["tool_call", "tool_result"], moved
    assert moved[-1]["call"] == frame["call"] == world.logged()[-1]["call"]


# ==================================================================== the status control


@pytest.mark.parametrize(
    ("content", "shown"),
    [
        pytest.param(b"available\x00\n", "available\\x00", id="a-NUL"),
        pytest.param(b"avail\xffable\n", "avail", id="a-byte-not-UTF-8"),
        pytest.param(b"available\x1b[2J\n", "available\\x1b[2J", id="a-terminal-escape"),
        pytest.param(b"\xef\xbb\xbfavailable\n", "\\ufeffavailable", id="a-byte-order-mark"),
    ],
)
def test_a_status_control_with_odd_bytes_refuses_every_call_and_says_so_escaped(
    world, content, shown
):
    """T-1, docs/tools.md "A tool on disk": a call is refused (EACCES, exit 126) unless the
    ``status`` control reads ``available``; one holding a NUL, a byte that is not UTF-8 or
    a terminal escape does not.  The refusal names the control to fix, shows the status
    escaped on the terminal, is recorded in the session and the tool's log, and nothing
    runs; written back as ``available``, the tool runs again."""
    status = world.controls("t") / "status"
    status.write_bytes(content)
    term = world.terminal("t", "x")
    message = refused(term, "EACCES", 126)
    assert not any(c in term.err for c in "\x00\x1b\ufeff"), term
    assert f"(status: {shown}" in message and "t.d/status reads 'available'" in message, term
    frame = result_frame(world.native("t"))
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EACCES", "resolve"), frame
    assert world.logged()[-1]["call"] == frame["call"] and frame["call"] in world.results()
    assert not world.ran()
    status.write_bytes(b"available\r\n")  # as an editor on another system saves it
    assert world.terminal("t", "y").out == "t y\n"
