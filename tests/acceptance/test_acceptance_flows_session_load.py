"""End-to-end flows of sessions under load (SPEC §4 S-1 … S-6, T-7), as a user who watches them
live: ``ctx session tail --follow`` in text and ``--json`` kept running while several processes
record into one session, torn lines are left and ``ctx session repair`` cuts them, and the
session grows to thousands of events; then ``session show`` / ``list`` on home and shared
sessions of two agents with odd but legal names, and the tool's ``log`` next to each event."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

SPACE = "load-space"
AGENTS = ("alpha", "beta")
PYTHON = str(REPO / ".venv" / "bin" / "python")

ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then printf '%s\\n' "$*"; else cat; fi
"""

# A program recording notes into a session through the library, as a worker does
# (docs/sessions.md, "For workers and other callers"): one descriptor for every event.
WRITER = """\
import sys, time
from pathlib import Path
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership

root, uid, gid, agent, name, tag, count = sys.argv[1:8]
ref = SessionRef.home(Path(root), int(uid), agent, name)
with open_session(ref, owner=Ownership(int(uid), int(gid))) as session:
    for seq in range(int(count)):
        session.record("load.note", object="test/" + tag, status="ok", writer=tag, seq=seq,
                       pad=tag * 40)
        if seq % 100 == 99:
            time.sleep(0.1)
"""

SECRET = "Zq81-hunter2-not-for-logs"
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
FRAGMENT = b'{"ts":"2026-06-22T12:00:00Z","type":"tool_result","agent":"alpha","session":"lo'


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    user: UnprivilegedUser

    def native(self, agent: str, payload: dict, *options: str) -> Run:
        return self.ctx("run", "--agent", agent, *options, "--native", "demo.echo",
                        input=json.dumps(payload))  # fmt: skip

    def home_session(self, agent: str, session: str) -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / agent / "session" / session

    def shared_session(self, agent: str, session: str) -> Path:
        return self.storage / "shared" / SPACE / "agent" / agent / "session" / session

    def tool_log(self) -> list[dict]:
        data = (self.storage / "tool" / "demo.echo.d" / "log").read_bytes()
        assert data.endswith(b"\n"), data[-200:]
        return [json.loads(line) for line in data.decode().splitlines()]

    def writer(self, session: str, tag: str, count: int) -> subprocess.Popen:
        argv = [PYTHON, "-c", WRITER, str(self.storage), str(self.user.uid), str(self.user.gid),
                "alpha", session, tag, str(count)]  # fmt: skip
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=REPO, env=self.env, start_new_session=True)  # fmt: skip


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = Path(tempfile.mkdtemp(prefix="cortexfs-flow-session-load-", dir="/tmp"))
    try:
        top.chmod(0o755)
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        r = ctx_run("shared", "create", SPACE, "--group", grp.getgrgid(user.gid).gr_name, env=env)
        assert r.rc == 0, r
        r = ctx_run("object", "install", tool_manifest(top, "demo.echo", ECHO), "--tier", "system",
                    env=env)  # fmt: skip
        assert r.rc == 0, r
        for name in AGENTS:
            request = {"name": name, "label": f"{name}_t", "mount": [], "tools": ["demo.echo"],
                       "shared": {SPACE: ["read", "write"]}}  # fmt: skip
            (top / f"{name}.json").write_text(json.dumps(request))
            r = ctx_run("agent", "create", "--user", user.name, top / f"{name}.json", env=env)
            assert r.rc == 0, r
            with (storage / "tool" / "demo.echo.d" / "policy").open("a") as policy:
                policy.write(f"allow {name}_t tool:demo.echo execute\n")
        yield World(storage, top, user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def strict_lines(path: Path) -> list[dict]:
    """Every line of a file, each of which must be one whole JSON object."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def shown(world: World, *args: str) -> list[dict]:
    r = world.ctx("session", "show", *args, "--json")
    assert r.rc == 0, r
    return [json.loads(line) for line in r.lines()]


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def follow(world: World, out: Path, *args: str) -> subprocess.Popen:
    """``ctx session tail ARGS --follow`` writing into ``out``, in a process group of its own."""
    with out.open("wb") as sink:
        return subprocess.Popen([*CTX_ARGV, "session", "tail", *args, "--follow"],
                                stdout=sink, stderr=subprocess.PIPE, env=world.env,
                                start_new_session=True)  # fmt: skip


def tear(events_file: Path) -> None:
    """Leave a torn last line as an appender that died in the middle of its write would: the
    fragment written under the log's lock, which no append holds meanwhile (S-5)."""
    fd = os.open(events_file, os.O_WRONLY | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, FRAGMENT)
    finally:
        os.close(fd)


def assert_text_matches(text_lines: list[str], events: list[dict]) -> None:
    """Text output: one line per event — time, type, object, status, then key=value facts."""
    assert len(text_lines) == len(events), (len(text_lines), len(events))
    for line, event in zip(text_lines, events, strict=True):
        words = line.split()
        assert words[:4] == [event["ts"], event["type"], event["object"], event["status"]], (
            line,
            event,
        )
        fact = f"seq={event['seq']}" if "seq" in event else f'call="{event["call"]}"'
        assert fact in words, (fact, line)


def assert_log_matches(world: World, events: list[dict], session_dir: str) -> None:
    """T-7, S-4: each call in ``events`` is one ``tool_result`` line of the tool's log holding
    the same summaries (input or argv, output) and facts, and naming where its session is."""
    calls = {e["call"]: e for e in events if e["type"] == "tool_call"}
    results = {e["call"]: e for e in events if e["type"] == "tool_result"}
    assert calls.keys() == results.keys(), (calls.keys(), results.keys())
    logged = [e for e in world.tool_log() if e.get("call") in calls]
    assert sorted(e["call"] for e in logged) == sorted(calls), logged
    for line in logged:
        call, result = calls[line["call"]], results[line["call"]]
        assert line["type"] == "tool_result" and line["session_dir"] == session_dir, line
        for key in ("agent", "session", "object", "status", "exit_status", "duration_ms"):
            assert line[key] == result[key], (key, line, result)
        for key in ("mode", "input", "argv"):
            assert line.get(key) == call.get(key), (key, line, call)
        assert line.get("output") == result.get("output"), (line, result)


# ------------------------------------------------------------------ watching a busy session


def test_followers_show_every_event_once_in_order_through_load_tears_repairs_and_a_pause(world):
    """S-2, S-4, S-5, T-7: ``tail --follow`` in text and ``--json``, started first, print every
    complete event exactly once and in file order while two library writers add 3000 events,
    ``ctx run`` calls record in both modes, torn lines are left and ``session repair`` runs and
    one follower is paused (^Z) and resumed: never a fragment, each torn line cut by whoever came
    first; a follower started on the large session with ``-n 5`` prints its last five; a reader
    that leaves ends its follower quietly (141); ^C and SIGTERM end theirs on a whole line; the
    tool log holds each call with the same redacted, cut summaries as the session."""
    session = "load"
    seed = world.native("alpha", {"n": "seed"}, "--session", session)
    assert seed.rc == 0, seed
    events_file = world.home_session("alpha", session) / "events.jsonl"
    as_json, as_text = world.top / "follow.jsonl", world.top / "follow.txt"
    followers = [
        follow(world, as_json, "alpha", session, "-n", "100", "--json"),
        follow(world, as_text, "alpha", "--session", session, "-n", "100"),
    ]
    procs: list[subprocess.Popen] = []
    repairs: list[int] = []
    try:
        assert wait_for(lambda: line_count(as_json) == 2 and line_count(as_text) == 2, 15)
        procs += [world.writer(session, tag, 1500) for tag in ("w0", "w1")]
        base = [*CTX_ARGV, "run", "--agent", "alpha", "--session", session]
        for i in range(3):
            payload = {
                "i": i,
                "items": list(range(30)),
                "wide": {f"k{n:02d}": n for n in range(25)},
                "db_password": SECRET,
                TOKEN: "a token used as a key",
                "tokenizer": "bpe",
                "notes": "N" * 3000,
            }
            native = subprocess.Popen([*base, "--native", "demo.echo"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=world.env, start_new_session=True)  # fmt: skip
            native.stdin.write(json.dumps(payload).encode())
            native.stdin.close()
            native.stdin = None
            procs.append(native)
        for i in range(2):
            words = ["--password", SECRET, f"term{i}", *map(str, range(25))]
            procs.append(subprocess.Popen([*base, "demo.echo", *words], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          env=world.env, start_new_session=True))  # fmt: skip
        followers[0].send_signal(signal.SIGSTOP)  # ^Z: the JSON follower falls behind
        while any(proc.poll() is None for proc in procs):
            tear(events_file)
            r = world.ctx("session", "repair", "alpha", session, "--json")
            assert r.rc == 0, r
            repairs.append(r.json()["truncated_bytes"])
            time.sleep(0.1)
        followers[0].send_signal(signal.SIGCONT)
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (proc.args, out[-300:], err[-2000:])

        # A quiet moment: a torn line nobody cuts is left out by every reader.
        middle = strict_lines(events_file)
        assert wait_for(lambda: line_count(as_json) == len(middle), 20), line_count(as_json)
        tear(events_file)
        r = world.ctx("session", "show", "alpha", session, "--json")
        assert r.rc == 0 and f"torn line of {len(FRAGMENT)} bytes" in r.err, r
        assert [json.loads(line) for line in r.lines()] == middle
        late = world.top / "late.jsonl"
        followers.append(follow(world, late, "alpha", session, "-n", "5", "--json"))
        assert wait_for(lambda: line_count(late) == 5, 15)
        assert strict_lines(late) == middle[-5:]
        piped = subprocess.Popen([*CTX_ARGV, "session", "tail", "alpha", session, "-n", "1",
                                  "--follow", "--json"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=world.env,
                                 start_new_session=True)  # fmt: skip
        followers.append(piped)
        assert json.loads(piped.stdout.readline()) == middle[-1]
        # Every follower reaches the torn line (the text one renders more, and may lag)...
        caught_up = wait_for(lambda: line_count(as_json) == line_count(as_text) == len(middle), 30)
        assert caught_up, (line_count(as_json), line_count(as_text), len(middle))
        time.sleep(0.5)  # ... and shows nothing of it
        assert line_count(as_json) == line_count(as_text) == len(middle)
        assert FRAGMENT not in as_json.read_bytes() + late.read_bytes()
        r = world.ctx("session", "repair", "alpha", session, "--json")
        assert r.rc == 0 and r.json()["truncated_bytes"] == len(FRAGMENT), r
        assert strict_lines(events_file) == middle
        piped.stdout.close()  # the reader of the pipe leaves
        last = world.native("alpha", {"n": "last"}, "--session", session)
        assert last.rc == 0, last
        for n in range(5):  # it notices once it writes again
            if piped.poll() is not None:
                break
            w = world.writer(session, f"x{n}", 1)
            assert w.wait(timeout=30) == 0, w.communicate()
            time.sleep(0.3)
        assert piped.wait(timeout=5) == 141, piped.returncode
        # It said only what it found at its start (the torn line), nothing of the pipe.
        assert piped.stderr.read().decode().splitlines() == [
            f"ctx: note: {events_file} ends with a torn line of {len(FRAGMENT)} bytes "
            f"(skipped; 'ctx session repair alpha --session {session} --uid {world.user.uid}' "
            "truncates it)"
        ]

        final = strict_lines(events_file)
        assert shown(world, "alpha", session) == final
        assert wait_for(lambda: line_count(as_json) == line_count(as_text) == len(final), 20)
        time.sleep(0.3)
        followers[1].send_signal(signal.SIGINT)  # ^C
        followers[0].send_signal(signal.SIGTERM)
        assert followers[1].wait(timeout=10) == 0  # docs/sessions.md: Ctrl-C ends --follow
        assert followers[0].wait(timeout=10) == -signal.SIGTERM
        for proc in followers[:2]:
            assert b"Traceback" not in proc.stderr.read()
    finally:
        for proc in procs + followers:
            stop(proc)

    # The JSON follower printed exactly the session, once each and in order; the text one a
    # line for each event; the late one its last five and what came after.
    assert strict_lines(as_json) == final
    text = as_text.read_bytes()
    assert text.endswith(b"\n") and b'"tool_result","agent":"alpha","session":"lo' not in text
    assert_text_matches(text.decode().splitlines(), final)
    assert strict_lines(late) == middle[-5:] + final[len(middle) :]

    notes = [e for e in final if e["type"] == "load.note"]
    for tag in ("w0", "w1"):
        assert [e["seq"] for e in notes if e["writer"] == tag] == list(range(1500)), tag
    assert len(final) > 3000 and events_file.stat().st_size > 300_000
    # Each torn line was cut whole, by a repair or by the next appender, never glued onto.
    assert all(n in (0, len(FRAGMENT)) for n in repairs), repairs
    assert repairs and len(final) == len(notes) + 2 * (1 + 3 + 2 + 1)

    calls = [e for e in final if e["type"] == "tool_call"]
    natives = [e["input"] for e in calls if e["mode"] == "native" and "items" in e["input"]]
    assert len(natives) == 3, calls
    for summary in natives:
        assert summary["items"] == [*range(20), "[+10 items]"], summary
        assert list(summary["wide"])[-1] == "[+5 keys]" and len(summary["wide"]) == 21, summary
        assert summary["db_password"] == "[redacted]" and summary["tokenizer"] == "bpe", summary
        assert summary["[redacted]"] == "a token used as a key", summary
        assert summary["notes"] == "N" * 200 + "…[+2800 chars]", summary["notes"][-30:]
    terminal = [e["argv"] for e in calls if e["mode"] == "terminal"]
    assert len(terminal) == 2 and all(argv[:2] == ["--password", "[redacted]"] for argv in terminal)
    assert all(len(argv) == 21 and argv[-1] == "[+8 words]" for argv in terminal), terminal
    blob = events_file.read_text() + (world.storage / "tool/demo.echo.d/log").read_text()
    assert SECRET not in blob and TOKEN not in blob and "N" * 201 not in blob
    assert_log_matches(world, final, f"home/{world.user.uid}/agent/alpha/session/{session}")


# ------------------------------------------------------------------ side by side


ODD_NAMES = ("events.jsonl", "x.D", "0", "a..b--__.z", "session")


def test_home_and_shared_sessions_of_two_agents_with_odd_legal_names_stay_apart(world):
    """S-1, S-2, S-6, R-3, T-7: sessions named ``events.jsonl``, ``x.D``, ``0``,
    ``a..b--__.z`` and ``session`` — legal object names — for two agents, in their home and in
    a shared space, are each their own directory in the S-1 layout; ``show``, ``tail`` and
    ``list`` of each (home by default, the space with ``--project``) give only its own events,
    as does a ``--project`` follower started before the calls; the tool log names each call's
    session and where it lives; a uid outside the space's group cannot read it (EACCES)."""
    places = [(agent, name, where) for agent in AGENTS for name in ODD_NAMES
              for where in ("home", "shared")]  # fmt: skip

    def record(place: tuple[str, str, str]) -> Run:
        agent, name, where = place
        project = ["--project", SPACE] if where == "shared" else []
        return world.native(agent, {"who": agent, "name": name, "where": where},
                            "--session", name, *project)  # fmt: skip

    # Someone watches alpha's session "0" of the space before anything is recorded there.
    seed = world.native("alpha", {"seed": 1}, "--session", "0", "--project", SPACE)
    assert seed.rc == 0, seed
    watched = world.top / "watched-0.jsonl"
    watcher = follow(world, watched, "alpha", "0", "--project", SPACE, "-n", "0", "--json")
    try:
        time.sleep(0.5)
        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(record, places))
        assert [r.rc for r in runs] == [0] * len(places), [r for r in runs if r.rc]
        expected = strict_lines(world.shared_session("alpha", "0") / "events.jsonl")[2:]
        assert wait_for(lambda: line_count(watched) >= 2, 15)
        time.sleep(0.3)
    finally:
        stop(watcher)
    assert strict_lines(watched) == expected and len(expected) == 2, expected
    assert all(e["input"] == {"who": "alpha", "name": "0", "where": "shared"}
               for e in expected if e["type"] == "tool_call")  # fmt: skip

    uid = world.user.uid
    for agent, name, where in places:
        if where == "home":
            directory, project = world.home_session(agent, name), []
            relative = f"home/{uid}/agent/{agent}/session/{name}"
            modes = (0o700, 0o600)
        else:
            directory, project = world.shared_session(agent, name), ["--project", SPACE]
            relative = f"shared/{SPACE}/agent/{agent}/session/{name}"
            modes = (0o3770, 0o660)
        events_file = directory / "events.jsonl"
        st_dir, st_file = directory.lstat(), events_file.lstat()
        assert (st_dir.st_mode & 0o7777, st_file.st_mode & 0o7777) == modes, (relative, modes)
        assert st_dir.st_uid == st_file.st_uid == uid, relative
        assert sorted(os.listdir(directory)) == ["events.jsonl"], relative
        stored = strict_lines(events_file)
        if (agent, name, where) == ("alpha", "0", "shared"):
            stored = stored[2:]  # after the seed call
        assert [e["type"] for e in stored] == ["tool_call", "tool_result"], stored
        assert all((e["agent"], e["session"]) == (agent, name) for e in stored), stored
        assert stored[0]["input"] == {"who": agent, "name": name, "where": where}, stored
        assert shown(world, agent, name, *project)[-2:] == stored
        assert shown(world, agent, "--session", name, *project)[-2:] == stored
        r = world.ctx("session", "tail", agent, name, *project, "-n", "1", "--json")
        assert r.rc == 0 and [json.loads(line) for line in r.lines()] == stored[-1:], r
        assert_log_matches(world, stored, relative)

    for agent in AGENTS:
        homes = world.home_session(agent, "x").parent
        spaces = world.shared_session(agent, "x").parent
        for project, base in (([], homes), (["--project", SPACE], spaces)):
            r = world.ctx("session", "list", agent, *project, "--json")
            assert r.rc == 0, r
            listed = {entry["name"]: entry["path"] for entry in r.json()}
            assert set(ODD_NAMES) <= set(listed), listed
            for name in ODD_NAMES:
                assert Path(listed[name]) == base / name, listed
            r = world.ctx("session", "list", agent, *project)
            assert r.rc == 0 and set(ODD_NAMES) <= set(r.lines()), r

    # A name known only in the space is not in the home, and the error names the listing.
    r = world.native("beta", {"only": "shared"}, "--session", "space-only", "--project", SPACE)
    assert r.rc == 0, r
    r = world.ctx("session", "show", "beta", "space-only")
    assert r.rc == 1 and "ENOENT" in r.err and "ctx session list beta" in r.err, r
    assert len(shown(world, "beta", "space-only", "--project", SPACE)) == 2
    # S-6 at the Linux step: a member of the space's group reads a shared session of it,
    # a uid outside the group is refused (EACCES, exit 1), as for another uid's home session.
    member = run_as(world.user, [*CTX_ARGV, "session", "show", "beta", "x.D", "--project", SPACE,
                                 "--json"], [world.user.gid], env=world.env)  # fmt: skip
    assert member.returncode == 0, member.stderr
    assert [json.loads(line) for line in member.stdout.splitlines()] == shown(
        world, "beta", "x.D", "--project", SPACE
    )
    entry = pwd.getpwnam("nobody")
    nobody = UnprivilegedUser("nobody", entry.pw_uid, entry.pw_gid)
    for project in (["--project", SPACE], []):
        outsider = run_as(nobody, [*CTX_ARGV, "session", "show", "beta", "x.D", *project],
                          env=world.env)  # fmt: skip
        assert outsider.returncode == 1 and "EACCES" in outsider.stderr, outsider
        assert outsider.stdout == "" and "Traceback" not in outsider.stderr, outsider
    # Given twice with two names is a usage error, not a silent pick.
    r = world.ctx("session", "show", "alpha", "0", "--session", "x.D")
    assert r.rc == 2 and "EINVAL" in r.err, r
