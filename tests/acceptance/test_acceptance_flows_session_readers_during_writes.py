"""Sessions read while they are being written (SPEC §4 S-1, S-2, S-5, S-6; docs/sessions.md,
"Appending, crash-safely", "Reading, torn lines and repair" and "Commands").

``ctx session show``, ``tail``, ``tail --follow`` (text and ``--json``), ``list`` and
``repair`` run while several processes append to one session: real ``ctx run --agent …
--session S`` calls in both modes, a program recording through the documented Python API from
several threads of one process (as a worker's job slots do), and a writer that holds the log's
shared lock with half of its line written while it is stopped (SIGSTOP) or killed (SIGKILL).
The file is also cut, removed, renamed away, made unreadable by its owner, given a line far
longer than any event, and grown to gigabytes by ``truncate`` while a follower reads it.

What must hold: a follower prints every complete event exactly once and in file order, never
a torn fragment or an interleaved line; it keeps following across what the manual says it
survives (a cut, a removal, a replacement), saying so on stderr, and otherwise ends with a
clear message naming the file and exit 1; ``repair`` waits for an append in flight and never
removes a complete event; readers never change the file, its modes or its directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as another uid")

AGENT = "coder"
LABEL = "coder_t"
TOOL = "demo.echo"
ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then printf '%s\\n' "$*"; else cat; fi
"""
TS = "2026-06-22T12:00:00Z"

# Records COUNT events from each of THREADS threads through one session opened with the
# documented API (docs/sessions.md, "For workers and other callers"): one descriptor shared
# by the threads, as a worker's job slots share it.
API_WRITER = """\
import sys, threading
from pathlib import Path
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership

root, uid, gid, agent, name, threads, count = sys.argv[1:8]
ref = SessionRef.home(Path(root), int(uid), agent, name)
with open_session(ref, owner=Ownership(int(uid), int(gid))) as session:
    def run(tag):
        for seq in range(int(count)):
            session.record("api.note", object="test/" + tag, status="ok",
                           durable_event=seq % 10 == 0, writer=tag, seq=seq, pad=tag * 30)
    workers = [threading.Thread(target=run, args=("t%d" % n,)) for n in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
"""

# One event of SIZE bytes of padding through the API: what it raised, or "recorded".
API_BIG = """\
import errno, sys
from pathlib import Path
from cortexfs.errors import CtxError
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership

root, uid, gid, agent, name, size = sys.argv[1:7]
ref = SessionRef.home(Path(root), int(uid), agent, name)
with open_session(ref, owner=Ownership(int(uid), int(gid))) as session:
    try:
        session.record("api.big", object="test/big", status="ok", pad="b" * int(size))
    except CtxError as exc:
        print(errno.errorcode[exc.errno])
    else:
        print("recorded")
"""

# An appender that follows the protocol of S-5 (shared flock around one O_APPEND write) but
# is stopped with the first CUT bytes of its line written; on SIGCONT it writes the rest.
HALTING = """\
import fcntl, os, signal, sys

path, line, cut = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
fcntl.flock(fd, fcntl.LOCK_SH)
os.write(fd, line[:cut])
os.kill(os.getpid(), signal.SIGSTOP)
os.write(fd, line[cut:])
os.fsync(fd)
fcntl.flock(fd, fcntl.LOCK_UN)
"""


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    user: UnprivilegedUser

    def session_dir(self, session: str) -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / AGENT / "session" / session

    def events(self, session: str) -> Path:
        return self.session_dir(session) / "events.jsonl"

    def call(self, session: str, tag: str) -> Run:
        """One native call of the agent in SESSION: its two events, whatever the tool did."""
        r = self.ctx("run", "--agent", AGENT, "--session", session, "--native", TOOL,
                     input=json.dumps({"tag": tag}))  # fmt: skip
        assert "Traceback" not in r.err, r
        return r

    def call_in_background(self, session: str, tag: str, *, terminal: bool) -> subprocess.Popen:
        base = [*CTX_ARGV, "run", "--agent", AGENT, "--session", session]
        argv = [*base, TOOL, "word", tag] if terminal else [*base, "--native", TOOL]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env,
                                start_new_session=True)  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(b"" if terminal else json.dumps({"tag": tag}).encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    def python(self, program: str, *args: object) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", program, *map(str, args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                                env=self.env, start_new_session=True)  # fmt: skip

    def api_args(self, session: str) -> list[object]:
        return [self.storage, self.user.uid, self.user.gid, AGENT, session]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__))
    try:
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        r = ctx_run("bootstrap", "--storage", storage)
        assert r.rc == 0, r
        manifest = tool_manifest(top / "tools", TOOL, ECHO)
        r = ctx_run("object", "install", manifest, "--tier", "system", env=env)
        assert r.rc == 0, r
        request = {"name": AGENT, "label": LABEL, "mount": [], "tools": [TOOL]}
        (top / "agent.json").write_text(json.dumps(request))
        r = ctx_run("agent", "create", "--user", user.name, top / "agent.json", env=env)
        assert r.rc == 0, r
        with (storage / "tool" / f"{TOOL}.d" / "policy").open("a") as policy:
            policy.write(f"allow {LABEL} tool:{TOOL} execute\n")
        yield World(storage, top, user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------ helpers


@dataclass
class Follower:
    proc: subprocess.Popen
    out: Path
    err: Path

    def count(self) -> int:
        return self.out.read_bytes().count(b"\n")

    def json(self) -> list[dict]:
        data = self.out.read_bytes()
        assert not data or data.endswith(b"\n"), data[-300:]
        return [json.loads(text) for text in data.decode().split("\n") if text]

    def said(self) -> str:
        return self.err.read_text()

    def interrupt(self) -> int:
        """Ctrl-C: its exit status."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=30)


@contextlib.contextmanager
def following(world: World, *args: str, user: UnprivilegedUser | None = None) -> Iterator[Follower]:
    """``ctx session tail AGENT ARGS --follow`` in the background (as ``user``, else root),
    its stdout and stderr in files; killed at the end of the block whatever happened."""
    stamp = time.monotonic_ns()
    out, err = world.top / f"follow-{stamp}.out", world.top / f"follow-{stamp}.err"
    as_user: dict = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": []}
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([*CTX_ARGV, "session", "tail", AGENT, *args, "--follow"],
                                stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=world.env,
                                start_new_session=True, **as_user)  # fmt: skip
    try:
        yield Follower(proc, out, err)
    finally:
        end(proc)


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def whole_events(path: Path) -> list[dict]:
    """Every line of ``path``, each of which must be one whole JSON object."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data[-300:]
    return [json.loads(text) for text in data.decode().split("\n") if text]


def event_line(kind: str, **facts: object) -> bytes:
    event = {"ts": TS, "type": kind, "agent": AGENT, "session": "s", "object": "test/x",
             "status": "ok", **facts}  # fmt: skip
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def append_bytes(path: Path, data: bytes) -> None:
    """``data`` appended as something other than ctx would: one write, no lock."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def holds_open(pid: int, path: Path) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                    return True
    return False


def halted_writer(world: World, path: Path, line: bytes, cut: int) -> subprocess.Popen:
    """A writer stopped with ``line[:cut]`` appended to ``path`` under the shared lock."""
    proc = world.python(HALTING, path, line.decode(), cut)
    assert wait_for(lambda: state_of(proc.pid) == "T" or proc.poll() is not None, 20)
    assert proc.poll() is None, proc.communicate()
    return proc


def fingerprint(path: Path) -> tuple:
    status = os.lstat(path)
    return (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns,
            status.st_mode, status.st_uid, status.st_gid, status.st_nlink)  # fmt: skip


def is_slice_to_the_end(part: list[dict], whole: list[dict]) -> bool:
    return len(part) <= len(whole) and whole[len(whole) - len(part) :] == part


# ------------------------------------------------------------------ many appenders at once


def test_followers_show_and_repair_during_runs_and_api_threads_lose_and_double_nothing(world):
    """S-2, S-5: while four ``ctx run`` calls (two native, two in terminal mode) and a program
    recording 4 × 150 events through the Python API from four threads append to one session,
    a ``--json`` and a text follower started before, a ``-n 3`` follower started in the middle,
    ``show --json``, ``list --json`` and ``repair --json`` run over and over.  Every ``show``
    prints a prefix of the final file, every ``repair`` finds nothing to cut, every ``list``
    names the session; the followers print the final file exactly (the late one: its last
    events from where it started), each thread's events in its own order, each call's
    ``tool_call`` before its ``tool_result``; Ctrl-C ends every follower with exit 0."""
    session = "busy"
    assert world.call(session, "seed").rc == 0
    path = world.events(session)
    shows: list[list[dict]] = []
    repairs: list[Run] = []
    lists: list[Run] = []
    writers: list[subprocess.Popen] = []
    with (
        following(world, session, "-n", "2", "--json") as as_json,
        following(world, session, "-n", "2") as as_text,
    ):
        assert wait_for(lambda: as_json.count() == 2 and as_text.count() == 2, 20)
        try:
            writers.append(world.python(API_WRITER, *world.api_args(session), 4, 150))
            for n in range(4):
                writers.append(world.call_in_background(session, f"c{n}", terminal=n % 2 == 1))
            late = None
            with contextlib.ExitStack() as stack:
                while any(proc.poll() is None for proc in writers) or late is None:
                    r = world.ctx("session", "show", AGENT, session, "--json")
                    assert r.rc == 0 and "Traceback" not in r.err, r
                    shows.append([json.loads(text) for text in r.lines()])
                    repairs.append(world.ctx("session", "repair", AGENT, session, "--json"))
                    lists.append(world.ctx("session", "list", AGENT, "--json"))
                    if late is None:
                        late = stack.enter_context(following(world, session, "-n", "3", "--json"))
                for proc in writers:
                    out, err = proc.communicate(timeout=60)
                    assert proc.returncode == 0, (proc.args, out[-500:], err[-2000:])
                final = whole_events(path)
                assert wait_for(lambda: as_json.count() == as_text.count() == len(final), 30)
                assert wait_for(lambda: late.json()[-1:] == final[-1:], 30)
                time.sleep(0.4)  # several polls: nothing more is printed
                assert late.interrupt() == 0, late.said()
                late_seen = late.json()
            assert as_json.interrupt() == 0 and as_text.interrupt() == 0
        finally:
            for proc in writers:
                end(proc)
        assert as_json.json() == final
        assert "Traceback" not in as_json.said() + as_text.said()
        text = as_text.out.read_text().splitlines()

    assert len(text) == len(final)
    for line, event in zip(text, final, strict=True):
        assert line.split()[:4] == [event["ts"], event["type"], event["object"], event["status"]]
    assert len(late_seen) >= 3 and is_slice_to_the_end(late_seen, final), len(late_seen)
    notes = [e for e in final if e["type"] == "api.note"]
    for tag in ("t0", "t1", "t2", "t3"):
        assert [e["seq"] for e in notes if e["writer"] == tag] == list(range(150)), tag
    calls: dict[str, list[str]] = {}
    for event in final:
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], []).append(event["type"])
    assert len(calls) == 5 and all(v == ["tool_call", "tool_result"] for v in calls.values())
    assert len(final) == len(notes) + 2 * 5
    for seen in shows:
        assert seen == final[: len(seen)], len(seen)
    for r in repairs:
        assert r.rc == 0 and r.json()["truncated_bytes"] == 0, r
    for r in lists:
        assert r.rc == 0 and session in [entry["name"] for entry in r.json()], r


# ------------------------------------------------------------------ a writer stopped mid-line


def test_a_writer_stopped_mid_line_holds_back_repair_and_the_next_call_and_loses_nothing(world):
    """S-5 (each append holds a shared flock for its write; repair and an appender that finds
    a torn line take the exclusive lock, so neither cuts a line being written): a writer has
    half of its line written and is stopped (SIGSTOP).  Followers print nothing of it, ``show``
    names it as torn; a ``repair`` and a ``ctx run`` started then wait, changing nothing.  Once
    the writer goes on, the repair cuts nothing and the call records after the whole line; the
    followers print the line once, then the call.  A second writer is killed (SIGKILL) with
    half a line written: the next appender (the Python API) cuts exactly that fragment, and
    the followers print what it records, never the fragment."""
    session = "held"
    assert world.call(session, "seed").rc == 0
    path = world.events(session)
    first = event_line("halted", pad="h" * 6000)
    second = event_line("killed", pad="k" * 6000)
    procs: list[subprocess.Popen] = []
    with (
        following(world, session, "--json") as as_json,
        following(world, session) as as_text,
    ):
        try:
            assert wait_for(lambda: as_json.count() == 2 and as_text.count() == 2, 20)
            before = path.read_bytes()
            writer = halted_writer(world, path, first, len(first) // 2)
            procs.append(writer)
            shown = world.ctx("session", "show", AGENT, session, "--json")
            assert shown.rc == 0, shown
            assert shown.out.encode() == before, shown
            assert f"torn line of {len(first) // 2} bytes" in shown.err, shown
            repair = subprocess.Popen([*CTX_ARGV, "session", "repair", AGENT, session, "--json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=world.env, start_new_session=True)  # fmt: skip
            procs.append(repair)
            call = world.call_in_background(session, "waiting", terminal=False)
            procs.append(call)
            for proc in (repair, call):
                assert wait_for(lambda p=proc: holds_open(p.pid, path) or p.poll() is not None)
            time.sleep(0.5)  # both keep waiting while the writer holds its lock
            assert repair.poll() is None and call.poll() is None
            assert path.read_bytes() == before + first[: len(first) // 2]
            assert as_json.count() == 2 and as_text.count() == 2
            writer.send_signal(signal.SIGCONT)
            assert writer.wait(timeout=20) == 0
            out, err = repair.communicate(timeout=30)
            assert repair.returncode == 0 and json.loads(out)["truncated_bytes"] == 0, err
            out, err = call.communicate(timeout=30)
            assert b"Traceback" not in err, err
            after = whole_events(path)
            assert path.read_bytes().startswith(before + first)
            assert [e["type"] for e in after[2:]] == ["halted", "tool_call", "tool_result"]
            assert wait_for(lambda: as_json.count() == as_text.count() == 5, 20)

            killed = halted_writer(world, path, second, len(second) // 2)
            procs.append(killed)
            end(killed)
            assert path.read_bytes().endswith(second[: len(second) // 2])
            api = world.python(API_WRITER, *world.api_args(session), 1, 3)
            procs.append(api)
            out, err = api.communicate(timeout=30)
            assert api.returncode == 0, err
            final = whole_events(path)
            assert len(final) == 8 and [e["type"] for e in final[5:]] == ["api.note"] * 3
            assert wait_for(lambda: as_json.count() == as_text.count() == 8, 20)
            r = world.ctx("session", "repair", AGENT, session, "--json")
            assert r.rc == 0 and r.json()["truncated_bytes"] == 0, r
            time.sleep(0.3)
            assert as_json.interrupt() == 0 and as_text.interrupt() == 0
        finally:
            for proc in procs:
                if state_of(proc.pid) == "T":
                    proc.send_signal(signal.SIGCONT)
                end(proc)
        assert as_json.json() == final
        printed = as_json.out.read_bytes() + as_text.out.read_bytes()
        assert b"kkkkkkkk" not in printed
        text = as_text.out.read_text().splitlines()
        assert [line.split()[1] for line in text] == [e["type"] for e in final]
        assert "Traceback" not in as_json.said() + as_text.said()


# ------------------------------------------------------------------ cut, removed, rotated


def test_a_follower_goes_on_across_a_cut_a_removal_and_a_rotation_saying_each(world):
    """S-5, docs/sessions.md ("A file that shrinks below what was read … is read again from
    its start, after a note on stderr (``ctx: note: PATH shrank to N bytes, from the M read:
    following it again from its start``)"; "One that is removed is waited for (``ctx: note:
    PATH is gone: waiting for it to appear again``) and read from its start when a file is
    there again"): the agent's file is cut to nothing, removed, then renamed away as a log
    rotation does; after each, ``ctx run`` records again.  The follower says each note and
    prints each new event once; the rotated file is left as it was."""
    session = "rotated"
    for tag in ("a", "b"):
        assert world.call(session, tag).rc == 0
    path = world.events(session)
    printed = whole_events(path)
    with following(world, session, "--json") as follower:
        assert wait_for(lambda: follower.count() == 4, 20)
        read = path.stat().st_size
        os.truncate(path, 0)
        note = (
            f"ctx: note: {path} shrank to 0 bytes, from the {read} read: "
            "following it again from its start"
        )
        assert wait_for(lambda: note in follower.said(), 20), follower.said()
        assert world.call(session, "after-cut").rc == 0
        printed += whole_events(path)
        assert wait_for(lambda: follower.count() == 6, 20)

        path.unlink()
        gone = f"ctx: note: {path} is gone: waiting for it to appear again"
        assert wait_for(lambda: gone in follower.said(), 20), follower.said()
        assert world.call(session, "after-removal").rc == 0
        printed += whole_events(path)
        assert wait_for(lambda: follower.count() == 8, 20)

        rotated = path.with_name("events.jsonl.1")
        path.rename(rotated)
        kept = rotated.read_bytes()
        assert wait_for(lambda: follower.said().count(gone) == 2, 20), follower.said()
        assert world.call(session, "after-rotation").rc == 0
        printed += whole_events(path)
        assert wait_for(lambda: follower.count() == 10, 20)
        time.sleep(0.4)
        assert follower.interrupt() == 0
        assert follower.json() == printed
        said = follower.said().splitlines()
        assert said.count(note) == 1 and said.count(gone) == 2, said
        restarts = [line for line in said if gone not in line]
        assert all(line.endswith("following it again from its start") for line in restarts)
        assert len(restarts) >= 2 and "Traceback" not in follower.said(), said
    assert rotated.read_bytes() == kept


def test_a_follower_reads_a_session_made_again_after_its_directory_was_removed(world):
    """S-1, S-5 (a removed file "is waited for … and read from its start when a file is there
    again"): the agent removes the whole session directory, as ``rm -r`` of a session does,
    and a later ``ctx run --session`` of the same name makes it again.  The follower, which
    said it was waiting for the file to appear again, prints the new call."""
    session = "remade"
    assert world.call(session, "first").rc == 0
    path = world.events(session)
    with following(world, session, "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20)
        shutil.rmtree(world.session_dir(session))
        assert wait_for(lambda: "is gone: waiting" in follower.said(), 20), follower.said()
        assert world.call(session, "again").rc == 0
        assert [e["type"] for e in whole_events(path)] == ["tool_call", "tool_result"]
        wait_for(lambda: follower.count() == 4, 2)
        assert follower.json()[2:] == whole_events(path), follower.said()


def test_a_slow_follower_prints_the_last_events_of_a_file_renamed_away(world):
    """S-5, docs/sessions.md (``tail --follow`` follows a file that another replaces, "as
    ``tail -F`` does"): a follower falls behind (stopped, as one whose terminal or pipe is
    not read is held in its write); meanwhile a call records two events, the file is rotated
    away and the next call starts a new one.  When it goes on, the follower prints the two
    events of the old file it had not read, then the new file: none is lost."""
    session = "slow"
    assert world.call(session, "first").rc == 0
    path = world.events(session)
    with following(world, session, "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20)
        follower.proc.send_signal(signal.SIGSTOP)
        try:
            assert world.call(session, "unread").rc == 0
            old = whole_events(path)
            path.rename(path.with_name("events.jsonl.1"))
            assert world.call(session, "new-file").rc == 0
        finally:
            follower.proc.send_signal(signal.SIGCONT)
        new = whole_events(path)
        wait_for(lambda: follower.count() >= 6, 2)
        assert follower.json() == old + new, follower.said()


def test_a_follower_names_a_damaged_line_appended_while_it_follows(world):
    """S-5, docs/sessions.md ("A complete line that holds no event is reported as damaged and
    skipped"): while a follower runs, a line holding no event is appended (by a program of
    the agent's), then a call records.  The follower prints the call's events and, as ``show``
    does for the same file, says on stderr that it skipped a damaged line."""
    session = "damaged-live"
    assert world.call(session, "first").rc == 0
    path = world.events(session)
    with following(world, session, "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20)
        append_bytes(path, b"this line holds no event\n")
        assert world.call(session, "after").rc == 0
        assert wait_for(lambda: follower.count() == 4, 20)
        time.sleep(0.4)
        assert follower.interrupt() == 0
    shown = world.ctx("session", "show", AGENT, session)
    assert shown.rc == 0 and f"skipped damaged lines 3 of {path}" in shown.err, shown
    assert [e["type"] for e in follower.json()] == ["tool_call", "tool_result"] * 2
    assert "damaged" in follower.said(), follower.said()


# ------------------------------------------------------------------ past the limits


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_a_follower_stays_small_past_a_huge_line_a_refused_event_and_a_sparse_gigabyte(world):
    """S-5, docs/sessions.md (an event is at most 64 KiB, a longer one refused with ``EFBIG``
    when it is encoded; a longer complete line is damaged, its last 64 KiB still searched for
    a glued event; a file grown to gigabytes with ``truncate`` costs a reader what it holds in
    data): while a follower runs, a 300 KiB line ending in a glued whole event is appended —
    the follower prints that event alone; the Python API refuses a 70 KiB event with EFBIG and
    writes nothing; the file is grown by 4 GiB of hole — the follower prints nothing and stays
    small, ``show`` names the torn line; the next ``ctx run`` cuts the hole and records, and
    the follower prints its two events."""
    session = "huge"
    assert world.call(session, "first").rc == 0
    path = world.events(session)
    start = whole_events(path)
    glued = event_line("glued", n=1)
    with following(world, session, "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20)
        append_bytes(path, b'{"ts":"' + b"x" * (300 << 10) + glued)
        assert wait_for(lambda: follower.count() == 3, 20)
        assert follower.json()[-1] == json.loads(glued)

        before = path.read_bytes()
        big = world.python(API_BIG, *world.api_args(session), 70_000)
        out, err = big.communicate(timeout=30)
        assert big.returncode == 0 and out.decode().strip() == "EFBIG", err
        assert path.read_bytes() == before

        os.truncate(path, len(before) + (4 << 30))
        time.sleep(1.0)  # five polls of the hole
        assert follower.proc.poll() is None and follower.count() == 3
        assert rss_kib(follower.proc.pid) < 200_000
        shown = world.ctx("session", "show", AGENT, session, "--json")
        assert shown.rc == 0 and f"torn line of {4 << 30} bytes" in shown.err, shown
        assert [json.loads(t) for t in shown.lines()] == [*start, json.loads(glued)], shown

        assert world.call(session, "after-hole").rc == 0
        assert path.stat().st_size < len(before) + 4096
        assert path.read_bytes().startswith(before)
        assert wait_for(lambda: follower.count() == 5, 20)
        time.sleep(0.3)
        assert follower.interrupt() == 0
        printed = follower.json()
    assert printed[:3] == [*start, json.loads(glued)]
    assert [e["type"] for e in printed[3:]] == ["tool_call", "tool_result"]
    assert [e["input"] for e in printed[3:4]] == [{"tag": "after-hole"}]
    assert b"xxxxxxxx" not in follower.out.read_bytes()


# ------------------------------------------------------------------ readers change nothing


def test_readers_never_change_a_session_an_older_version_made_with_a_torn_line(world):
    """S-5, docs/sessions.md (``show`` and ``tail`` skip a torn last line, ``repair``
    truncates it; ``repair`` and bootstrap, not the readers, tighten the modes an older
    version gave a home session): a session with modes 0750/0640, a damaged line and a torn
    last line is read by ``show`` and ``tail`` (text and ``--json``), followed for a while and
    listed.  The file's bytes, inode, times, modes and owner, and the directory's entries and
    mode, are as they were; then ``repair`` changes them (so the comparison could tell)."""
    session = "untouched"
    assert world.call(session, "first").rc == 0
    directory = world.session_dir(session)
    path = world.events(session)
    append_bytes(path, b"no event here\n" + event_line("last") + b'{"ts":"torn')
    directory.chmod(0o750)
    path.chmod(0o640)
    time.sleep(0.05)  # any change would move the times
    file_before, dir_before = fingerprint(path), fingerprint(directory)
    bytes_before, entries_before = path.read_bytes(), sorted(os.listdir(directory))
    reads = [
        ("show", AGENT, session),
        ("show", AGENT, session, "--json"),
        ("tail", AGENT, session, "-n", "1"),
        ("tail", AGENT, "--session", session, "-n", "0", "--json"),
        ("list", AGENT),
        ("list", AGENT, "--json"),
    ]
    for args in reads:
        r = world.ctx("session", *args)
        assert r.rc == 0 and "Traceback" not in r.err, r
        if args[0] != "list":
            assert "torn line of 11 bytes" in r.err, r
    with following(world, session, "-n", "5") as follower:
        assert wait_for(lambda: follower.count() == 3, 20)
        time.sleep(0.5)
        assert follower.interrupt() == 0
    assert "torn line of 11 bytes" in follower.said()
    assert "skipped damaged lines 3" in follower.said()
    assert path.read_bytes() == bytes_before and fingerprint(path) == file_before
    assert fingerprint(directory) == dir_before
    assert sorted(os.listdir(directory)) == entries_before

    r = world.ctx("session", "repair", AGENT, session, "--json")
    assert r.rc == 0 and r.json()["truncated_bytes"] == 11, r
    assert path.read_bytes() == bytes_before[:-11]
    assert (directory.stat().st_mode & 0o7777, path.stat().st_mode & 0o7777) == (0o700, 0o600)


# ------------------------------------------------------------------ made unreadable


@pytest.mark.parametrize(
    "made_unreadable",
    [
        "file",
        "directory",
    ],
)
def test_a_follower_run_by_the_agent_ends_naming_its_file_when_it_becomes_unreadable(
    world, made_unreadable
):
    """S-5, S-6, docs/sessions.md (errors name the file; ``--json`` prints the error as a JSON
    object): the agent's own uid follows its home session (``--uid``); then the file, or the
    session directory, is made unreadable (mode 000, as its owner may make it).  The follower,
    which printed the events so far, ends with exit 1 and ``ctx: EACCES:`` naming the whole
    path of what it may no longer read (the events file, or the session's directory), the
    same error as the last JSON line of its output."""
    session = f"unreadable-{made_unreadable}"
    assert world.call(session, "first").rc == 0
    path = world.events(session)
    target = path if made_unreadable == "file" else path.parent
    uid = str(world.user.uid)
    try:
        with following(world, session, "--uid", uid, "--json", user=world.user) as follower:
            assert wait_for(lambda: follower.count() == 2, 20), follower.said()
            target.chmod(0)
            assert wait_for(lambda: follower.proc.poll() is not None, 20), "it went on"
            rc = follower.proc.returncode
            lines = follower.out.read_text().splitlines()
            said = follower.said()
    finally:
        target.chmod(0o600 if target == path else 0o700)
    assert rc == 1 and "Traceback" not in said, said
    assert [json.loads(text) for text in lines[:2]] == whole_events(path)
    error = json.loads(lines[-1])
    assert len(lines) == 3 and error["error"] == "EACCES", lines
    assert said.splitlines()[-1].startswith("ctx: EACCES: "), said
    assert str(target) in said.splitlines()[-1] and str(target) in error["message"], error
