"""Flows of ``ctx session list|show|tail|repair`` over session files their writers made odd or
hostile (SPEC §4 S-1, S-5, S-6, R-3, T-3; docs/sessions.md "Reading, torn lines and repair",
"Commands").

An agent owns its home session and may put anything in it; a member of a space may write in
the space.  Whatever they leave there — lines that hold no event, megabytes without a newline,
non-UTF-8 bytes, NULs, JSON that is not an event, control bytes in any field, links, FIFOs,
directories, a file swapped under a running ``tail --follow``, an append still in flight — the
host's readers answer with the documented handling or an errno naming the file: never a
traceback, a hang, a link followed, a control byte raw on stdout, data cut beyond a torn last
line, or ``--json`` output that is not JSON."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    is_object_name,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as the agent's uid: needs root")

AGENT = "coder"
LABEL = "coder_t"
SPACE = "odd-space"
TS = "2026-06-22T12:00:00Z"
SECRET = "ROOT-ONLY-SECRET"
# C0 controls but the line feed, DEL and the C1 controls: none may reach a terminal raw (T-3).
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    user: UnprivilegedUser  # the agent's uid

    def session_dir(self, session: str, *, shared: bool = False, agent: str = AGENT) -> Path:
        if shared:
            return self.storage / "shared" / SPACE / "agent" / agent / "session" / session
        return self.storage / "home" / str(self.user.uid) / "agent" / agent / "session" / session

    def events(self, session: str, *, shared: bool = False) -> Path:
        return self.session_dir(session, shared=shared) / "events.jsonl"

    def session(self, *args: str, **kw) -> Run:
        return self.ctx("session", *args, **kw)

    def stranger(self, offset: int, *, member: bool) -> tuple[UnprivilegedUser, list[int]]:
        """Another uid than the agent's (no account needed: the kernel judges numbers), in the
        agent's group (a member of the space) or in none of its groups."""
        uid = self.user.uid + offset
        return UnprivilegedUser(f"uid{uid}", uid, uid), [self.user.gid] if member else []


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__))
    try:
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        r = ctx_run("bootstrap", "--storage", storage)
        assert r.rc == 0, r
        r = ctx_run("shared", "create", SPACE, "--group", grp.getgrgid(user.gid).gr_name, env=env)
        assert r.rc == 0, r
        workspace = top / "workspace"
        workspace.mkdir(mode=0o755)
        request = {"name": AGENT, "label": LABEL, "tools": ["fs.stat"],
                   "mount": [[str(workspace), "/workspace", "ro"]],
                   "shared": {SPACE: ["read", "write"]}}  # fmt: skip
        (top / "agent.json").write_text(json.dumps(request))
        r = ctx_run("agent", "create", "--user", user.name, top / "agent.json", env=env)
        assert r.rc == 0, r
        with (storage / "tool" / "fs.stat.d" / "policy").open("a") as policy:
            policy.write(f"allow {LABEL} tool:fs.stat execute\n")
        made = World(storage, top, user)
        record(made, "default")  # the agent's home and session/ directory, made by the product
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------ helpers


def record(world: World, session: str, *, shared: bool = False, path: str = "/workspace") -> Path:
    """One real tool call of the agent in SESSION (its ``tool_call`` and ``tool_result``
    recorded by ``ctx run``, which makes the session as the product makes it); its events
    file."""
    where = ["--project", SPACE] if shared else []
    r = world.ctx("run", "--agent", AGENT, "--session", session, *where, "--native", "fs.stat",
                  input=json.dumps({"path": path}))  # fmt: skip
    assert "Traceback" not in r.err, r
    events = world.events(session, shared=shared)
    assert [e["type"] for e in events_in(events)][-2:] == ["tool_call", "tool_result"], r
    return events


def written(world: World, session: str, data: bytes) -> Path:
    """A session the agent makes itself in its home (0700, events.jsonl 0600, as the product
    makes them) holding ``data``; its events file."""
    source = world.top / f"data-{time.monotonic_ns()}"
    source.write_bytes(data)
    source.chmod(0o644)
    events = world.events(session)
    try:
        as_agent(world, 'mkdir -m 0700 "$1" && umask 077 && cat "$2" > "$1/events.jsonl"',
                 events.parent, source)  # fmt: skip
    finally:
        source.unlink()
    return events


def as_agent(world: World, script: str, *args: object) -> None:
    """``sh -c SCRIPT`` as the agent's uid: what the agent may do to its own files."""
    done = run_as(world.user, ["/bin/sh", "-c", script, "sh", *map(str, args)])
    assert done.returncode == 0, done.stderr


def put(world: World, target: Path, data: bytes, *, append: bool = False) -> None:
    """``data`` written into ``target`` by the agent's uid (overwritten, or appended)."""
    source = world.top / f"data-{time.monotonic_ns()}"
    source.write_bytes(data)
    source.chmod(0o644)
    try:
        as_agent(world, 'cat "$1" >> "$2"' if append else 'cat "$1" > "$2"', source, target)
    finally:
        source.unlink()


def event(kind: str, **facts: object) -> dict:
    return {"ts": TS, "type": kind, "agent": AGENT, "session": "odd", "object": "test/odd",
            "status": "ok", **facts}  # fmt: skip


def line(value: object, *, ascii_only: bool = True) -> bytes:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass") + b"\n"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> object:
    """``text`` parsed as JSON as any reader would: no NaN, no Infinity."""
    return json.loads(text, parse_constant=_no_constant)


def json_lines(out: str) -> list:
    """Each line of ``out`` as strict JSON; split at line feeds only (``str.splitlines``
    would also split at U+0085 and the other Unicode line breaks a JSON string may hold)."""
    return [strict_json(text) for text in out.split("\n") if text]


def events_in(path: Path) -> list:
    return [json.loads(raw) for raw in path.read_bytes().split(b"\n") if raw]


def assert_printable(text: str) -> None:
    found = CONTROL.search(text)
    assert found is None, (found and found.group(), text[:2000])


def assert_clean(r: Run) -> None:
    assert "Traceback" not in r.err, r
    assert "\ufffd" not in r.out, r  # stdout was UTF-8 text
    assert_printable(r.out)
    assert_printable(r.err)


def assert_error(r: Run, code: str | None, path: Path, *, as_json: bool) -> None:
    """Exit 1, ``ctx: CODE: PATH …`` as the last line on stderr (any errno name when ``code``
    is None), and with --json the same error as one JSON object, the last line on stdout."""
    assert r.rc == 1, r
    assert "Traceback" not in r.err, r
    last = r.err.splitlines()[-1]
    name = re.escape(code) if code else "E[A-Z0-9]+"
    assert re.match(rf"ctx: {name}: {re.escape(str(path))}", last), r
    if as_json:
        error = strict_json(r.lines()[-1])
        assert re.fullmatch(name, error["error"]) and str(path) in error["message"], r


def fingerprint(path: Path) -> tuple:
    status = os.lstat(path)
    return (status.st_ino, status.st_size, status.st_mtime_ns, status.st_uid, status.st_gid,
            status.st_mode)  # fmt: skip


def root_only_secret(world: World, name: str) -> Path:
    """A file only root may read, holding a whole event and a torn line: what a link planted
    in a session would lead a reader to print, or a repair to cut."""
    vault = world.top / "vault"
    vault.mkdir(mode=0o700, exist_ok=True)
    secret = vault / name
    secret.write_bytes(line(event(SECRET)) + b'{"ts":"' + SECRET.encode())
    secret.chmod(0o600)
    return secret


@contextlib.contextmanager
def following(world: World, *args: str) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """``ctx session tail ARGS --follow`` in the background, its stdout and stderr in files;
    ended at the end of the block whatever happened."""
    stamp = time.monotonic_ns()
    out, err = world.top / f"follow-{stamp}.out", world.top / f"follow-{stamp}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([*CTX_ARGV, "session", "tail", *args, "--follow"], stdout=o,
                                stderr=e, stdin=subprocess.DEVNULL, env=world.env,
                                start_new_session=True)  # fmt: skip
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def interrupted(proc: subprocess.Popen) -> int:
    """Ctrl-C to a follower: its exit status."""
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=30)


# ------------------------------------------------------------------ lines that hold no event


GOOD = [event("good", n=n) for n in range(4)]
DAMAGED = {
    "not UTF-8": b'{"ts":"2026-06-22T12:00:00Z","type":"\xff\xfe\xc3"}',
    "a NUL between tokens": b'{"ts":"2026-06-22T12:00:00Z",\x00"type":"nul"}',
    "NULs only": b"\x00" * 64,
    "an array": b"[1, 2]",
    "a string": b'"text"',
    "a number": b"42",
    "null": b"null",
    "an empty object": b"{}",
    "an object without ts": b'{"type":"no ts","status":"ok"}',
    "an integer of 5000 digits": b'{"ts":"2026-06-22T12:00:00Z","n":' + b"9" * 5000 + b"}",
    "a line of three megabytes": b'{"ts":"2026-06-22T12:00:00Z","pad":"' + b"m" * (3 << 20) + b'"}',
}


def test_lines_that_hold_no_event_are_skipped_and_named_and_repair_keeps_them(world: World):
    """S-5, docs/sessions.md ("a complete line that holds no event is reported as damaged and
    skipped"; a line of 64 KiB or more is a damaged line like any other): between four whole
    events the agent writes lines of invalid UTF-8, NULs, JSON that is not an object, an
    object without ``ts``, an integer too long to read and a line of 3 MiB.  ``show`` and
    ``tail``, text and ``--json``, print the four events, name the damaged lines by number on
    stderr, and exit 0; ``repair`` finds nothing torn and leaves the file as it was, byte for
    byte, inode, time, owner and mode."""
    damaged = list(DAMAGED.values())
    content = [line(GOOD[0]), *damaged[:2], line(GOOD[1]), *damaged[2:8], line(GOOD[2]),
               *damaged[8:], line(GOOD[3])]  # fmt: skip
    data = b"".join(part if part.endswith(b"\n") else part + b"\n" for part in content)
    events = written(world, "damaged", data)
    numbers = [n for n, part in enumerate(content, start=1) if not part.endswith(b"\n")]
    named = f"skipped damaged lines {', '.join(map(str, numbers[:10]))}"
    before = fingerprint(events)

    for args in (
        ("show",),
        ("show", "--json"),
        ("tail", "-n", "100"),
        ("tail", "-n", "2", "--json"),
    ):
        r = world.session(*args, AGENT, "damaged")
        assert r.rc == 0, r
        assert_clean(r)
        note = next(text for text in r.err.splitlines() if "damaged" in text)
        assert named in note and str(events) in note, r
        wanted = GOOD[-2:] if "2" in args else GOOD
        if "--json" in args:
            assert json_lines(r.out) == wanted, r
        else:
            assert [text.split()[1] for text in r.lines()] == [e["type"] for e in wanted], r
    for args in (("repair",), ("repair", "--json")):
        r = world.session(*args, AGENT, "damaged")
        assert r.rc == 0, r
        assert_clean(r)
    assert r.json()["truncated_bytes"] == 0, r
    assert events.read_bytes() == data
    assert fingerprint(events) == before


ODD_EVENTS = [
    {"ts": TS},
    {"ts": 1750593600, "type": None, "object": {"a": 1}, "status": [1, 2]},
    {"ts": "yesterday at noon", "type": "note", "agent": AGENT, "object": "", "status": "ok"},
    {"ts": TS, "type": "\ud800", "\udfff": "a\udc80b"},
    {"ts": TS, "type": "nested", "d": json.loads("[" * 100 + "]" * 100)},
    {"ts": TS, "type": "numbers", "n": 10**300, "f": -1.5e300, "z": -0.0},
]


def test_events_of_odd_shape_are_shown_as_json_and_as_escaped_text(world: World):
    """S-2, T-3 (docs/sessions.md "Commands": text output is one line per event; ``--json``
    prints the events themselves): events only ``ts`` makes events of — no ``type``, a
    ``ts`` that is no time, ``null`` and lists in the columns, lone surrogates written as
    JSON escapes in a key and in values, 100 levels of nesting, numbers of 300 digits — are
    printed, one text line each with ``?``/``-`` for a missing column and every lone
    surrogate spelt as an escape, and with ``--json`` as strict JSON holding the same values."""
    written(world, "odd-shapes", b"".join(map(line, ODD_EVENTS)))

    as_json = world.session("show", AGENT, "odd-shapes", "--json")
    assert as_json.rc == 0, as_json
    assert_clean(as_json)
    assert json_lines(as_json.out) == ODD_EVENTS
    tail = world.session("tail", AGENT, "odd-shapes", "-n", "3", "--json")
    assert tail.rc == 0 and json_lines(tail.out) == ODD_EVENTS[-3:], tail

    text = world.session("show", AGENT, "odd-shapes")
    assert text.rc == 0, text
    assert_clean(text)
    lines = text.lines()
    assert len(lines) == len(ODD_EVENTS), text
    assert lines[0].split() == [TS, "?", "-", "-"], lines[0]
    assert lines[1].split()[:4] == ["1750593600", "null", '{"a":1}', "[1,2]"], lines[1]
    assert lines[2].startswith("yesterday at noon  note"), lines[2]
    assert "\\ud800" in lines[3] and "\\udfff" in lines[3] and "\\udc80" in lines[3], lines[3]
    assert "[" * 100 in lines[4] and str(10**300) in lines[5], text


# ------------------------------------------------------------------ what breaks the readers


DEEP = b'{"ts":"2026-06-22T12:00:00Z","type":"deep","d":' + b"[" * 5000 + b"]" * 5000 + b"}\n"


def test_a_deeply_nested_line_is_skipped_not_a_traceback(world: World):
    """S-5, docs/sessions.md (a complete line that holds no event is reported and skipped):
    the agent writes an event nested 5000 levels deep, 10 KB, well under the 64 KiB of a
    line.  ``show`` and ``tail``, text and ``--json``, and a running ``tail --follow`` that
    sees it appended, go on to the whole events after it, with no traceback."""
    events = written(world, "deep", line(GOOD[0]) + DEEP + line(GOOD[1]))
    for args in (("show",), ("show", "--json"), ("tail",), ("tail", "--json")):
        r = world.session(*args, AGENT, "deep")
        assert r.rc == 0 and "Traceback" not in r.err, r
        assert "good" in r.lines()[-1], r
    with following(world, AGENT, "deep", "-n", "1", "--json") as (proc, out, err):
        assert wait_for(lambda: b'"n":1' in out.read_bytes() or proc.poll() is not None, 30)
        put(world, events, DEEP + line(GOOD[2]), append=True)
        wait_for(lambda: b'"n":2' in out.read_bytes() or proc.poll() is not None, 30)
        assert "Traceback" not in err.read_text(), err.read_text()[-3000:]
        assert strict_json(out.read_text().split("\n")[-2]) == GOOD[2]
        assert interrupted(proc) == 0


NON_FINITE = (
    b'{"ts":"2026-06-22T12:00:00Z","type":"nan","v":NaN,"w":Infinity,"x":-Infinity,"y":1e999}\n'
)


def test_non_numbers_in_an_event_never_make_json_output_that_is_not_json(world: World):
    """S-2, docs/sessions.md (``show --json`` and ``tail --json`` print JSON Lines): the agent
    writes an event holding ``NaN``, ``Infinity``, ``-Infinity`` and ``1e999``, which Python
    reads but JSON has no number for.  Whatever the readers make of the line (skipped as
    damaged, or the values spelt otherwise), every line they print with ``--json`` is JSON."""
    written(world, "non-finite", line(GOOD[0]) + NON_FINITE + line(GOOD[1]))
    for args in (("show", "--json"), ("tail", "-n", "5", "--json")):
        r = world.session(*args, AGENT, "non-finite")
        assert r.rc == 0 and "Traceback" not in r.err, r
        printed = json_lines(r.out)
        assert GOOD[0] in printed and GOOD[1] in printed, r


# ------------------------------------------------------------------ control bytes


def test_c1_controls_from_an_agents_tool_input_reach_json_output_escaped(world: World):
    """T-3, S-2 (docs/sessions.md: the session holds the call's ``input``): the agent calls a
    tool with a path holding U+009B (CSI, which starts an escape sequence on a terminal that
    reads UTF-8 C1 controls), U+0085, DEL and ESC.  The text timeline shows each as an
    escape; ``show --json`` and ``tail --json``, read on the same terminal, must escape them
    too (``\\u009b``), which keeps each event the same JSON value."""
    path = "/workspace/x\u009b31m\u0085\u007f\u001b[2J"
    events = record(world, "c1", path=path)
    assert events_in(events)[0]["input"] == {"path": path}
    text = world.session("show", AGENT, "c1")
    assert text.rc == 0, text
    assert_clean(text)
    assert "\\x9b31m\\x85\\x7f" in text.out, text
    for args in (("show", "--json"), ("tail", "-n", "2", "--json")):
        r = world.session(*args, AGENT, "c1")
        assert r.rc == 0, r
        assert json_lines(r.out)[0]["input"] == {"path": path}, r
        assert_printable(r.out)


HOSTILE = {
    "ts": TS + "\x1b[2K\r",
    "type": "note\x1b]0;owned\x07",
    "agent": AGENT,
    "session": "odd",
    "object": "tool/\u202efs.stat\b\b",
    "status": "ok\u009b2J",
    "ke\x1by": "v\x7f\u0085\x00",
}


def test_control_bytes_in_every_field_reach_tail_and_follow_escaped(world: World):
    """T-3, S-2 (docs/sessions.md; the escaping of ``show`` is tested elsewhere): events the
    agent wrote with ESC, CR, BEL, BS, NUL, DEL, C1 controls and a bidirectional override in
    every column and in a key — stored as JSON escapes and as raw UTF-8 — are printed by
    ``tail`` and by a running ``tail --follow`` with each one escaped; Ctrl-C ends the
    follower with exit 0."""
    hostile = line(HOSTILE) + line(HOSTILE, ascii_only=False)
    events = written(world, "controls", line(GOOD[0]) + hostile)
    r = world.session("tail", AGENT, "controls", "-n", "2")
    assert r.rc == 0, r
    assert_clean(r)
    assert len(r.lines()) == 2, r
    for escaped in ("\\x1b[2K\\x0d", "\\x1b]0;owned\\x07", "\\u202efs.stat\\x08", "\\x9b2J"):
        assert all(escaped in text for text in r.lines()), (escaped, r)

    with following(world, AGENT, "controls", "-n", "1") as (proc, out, err):
        assert wait_for(lambda: out.read_bytes().count(b"\n") == 1, 30), out.read_bytes()
        put(world, events, line(HOSTILE, ascii_only=False) + line(GOOD[0]), append=True)
        assert wait_for(lambda: out.read_bytes().count(b"\n") == 3, 30), out.read_bytes()
        assert interrupted(proc) == 0
        shown = out.read_bytes().decode()
        assert_printable(shown)
        assert "\\x1b]0;owned\\x07" in shown and "good" in shown, shown
        assert_printable(err.read_text())


# ------------------------------------------------------------------ not a regular file


@pytest.mark.parametrize("kind", ["link to a root-only file", "link to /dev/zero", "FIFO",
                                  "directory"])  # fmt: skip
def test_an_events_file_that_is_not_a_regular_file_is_refused_naming_it(world: World, kind: str):
    """S-5, docs/sessions.md ("events.jsonl must be a regular file … so a link planted in a
    home never leads them to read or truncate a file elsewhere"): the agent replaces its
    events.jsonl with a link to a file only root may read, a link to /dev/zero, a FIFO or a
    directory.  ``show``, ``tail``, ``tail --follow`` and ``repair``, as root, text and
    ``--json``, each return at once with ``EINVAL`` naming the file (one JSON error object
    with ``--json``); nothing of the root-only file is printed and its torn line is not cut."""
    session = "not-regular-" + "".join(c for c in kind if c.isalnum())[:20]
    events = written(world, session, line(GOOD[0]))
    secret = root_only_secret(world, f"{session}.jsonl")
    kept = secret.read_bytes()
    make = {
        "link to a root-only file": f'rm "$1" && ln -s {secret} "$1"',
        "link to /dev/zero": 'rm "$1" && ln -s /dev/zero "$1"',
        "FIFO": 'rm "$1" && mkfifo "$1"',
        "directory": 'rm "$1" && mkdir "$1"',
    }[kind]
    as_agent(world, make, events)
    for args in (("show",), ("tail", "-f", "--json"), ("repair",), ("repair", "--json")):
        r = world.session(*args, AGENT, session, timeout=60)
        assert_error(r, "EINVAL", events, as_json="--json" in args)
        assert SECRET not in r.out and len(r.lines()) <= 1, r
    assert secret.read_bytes() == kept
    assert not stat.S_ISREG(os.lstat(events).st_mode)


def test_repair_refused_by_the_kernel_names_the_sessions_file(world: World):
    """S-5, docs/sessions.md ("… naming the file"): (1) the agent makes its events.jsonl a
    socket; ``show`` refuses it naming the whole path, ``repair`` must as well; (2) the agent
    makes its own events.jsonl read-only with a torn line and runs ``repair`` itself: the
    kernel refuses the write (``EACCES``), which must name the session's file, and nothing
    changes."""
    events = written(world, "socket", line(GOOD[0]))
    bind = "import socket; socket.socket(socket.AF_UNIX).bind('events.jsonl')"
    # Bound by its name in the session directory: a socket's path is at most 107 bytes.
    as_agent(world, f'cd "$1" && rm events.jsonl && {SYSTEM_PYTHON} -c "{bind}"', events.parent)
    shown = world.session("show", AGENT, "socket", "--json")
    assert_error(shown, None, events, as_json=True)
    for args in (("repair",), ("repair", "--json")):
        r = world.session(*args, AGENT, "socket")
        assert_error(r, None, events, as_json="--json" in args)
    assert stat.S_ISSOCK(os.lstat(events).st_mode)

    events = written(world, "read-only", line(GOOD[0]) + b'{"ts":"2026-06-22T12:00:00Z","ty')
    as_agent(world, 'chmod 0400 "$1"', events)
    kept = events.read_bytes()
    argv = [*CTX_ARGV, "session", "repair", AGENT, "read-only"]
    for extra in ([], ["--json"]):
        done = run_as(world.user, [*argv, *extra], env=world.env)
        r = Run([*argv[len(CTX_ARGV) :], *extra], done.returncode, done.stdout, done.stderr)
        assert_error(r, "EACCES", events, as_json=bool(extra))
    assert events.read_bytes() == kept


# ------------------------------------------------------------------ links above the session


@pytest.mark.parametrize("planted", ["home/UID/agent", "home/UID/agent/coder",
                                     "shared/SPACE/agent/ghost"])  # fmt: skip
def test_a_link_planted_above_the_session_is_never_followed(world: World, planted: str):
    """S-5, S-6, docs/sessions.md (the commands reach the session by a walk that opens every
    component without following a link): the agent swaps its home's ``agent`` directory, or
    its own ``agent/coder``, for a link to a root-only tree shaped like a home; a member of
    the space plants ``agent/ghost`` in the space as such a link.  ``show``, ``tail``,
    ``repair`` and ``list``, as root, refuse it with ``ENOTDIR`` naming the link, print
    nothing of the tree and cut nothing in it."""
    vault = world.top / f"tree-{planted.count('/')}-{planted.rsplit('/', 1)[-1]}"
    leaf = vault / "coder" / "session" if planted == "home/UID/agent" else vault / "session"
    (leaf / "s1").mkdir(parents=True)
    vault.chmod(0o700)
    secret = leaf / "s1" / "events.jsonl"
    secret.write_bytes(line(event(SECRET)) + b'{"ts":"' + SECRET.encode())
    kept = secret.read_bytes()
    link = world.storage / planted.replace("UID", str(world.user.uid)).replace("SPACE", SPACE)
    agent, where = ("ghost", ["--project", SPACE]) if "ghost" in planted else (AGENT, [])
    if agent == AGENT:
        record(world, "before-the-swap")
        as_agent(world, 'mv "$1" "$1.kept" && ln -s "$2" "$1"', link, vault)
    else:
        member, groups = world.stranger(20000, member=True)
        done = run_as(member, ["/bin/ln", "-s", str(vault), str(link)], groups)
        assert done.returncode == 0, done.stderr
    try:
        for args in (("show", agent, "s1"), ("tail", agent, "s1", "--json"),
                     ("repair", agent, "s1", "--json"), ("list", agent, "--json")):  # fmt: skip
            r = world.session(*args, *where)
            assert_error(r, "ENOTDIR", link, as_json="--json" in args)
            assert SECRET not in r.out, r
        assert secret.read_bytes() == kept
    finally:
        link.unlink()
        if agent == AGENT:
            as_agent(world, 'mv "$1.kept" "$1"', link)
    if agent == AGENT:
        assert world.session("show", AGENT, "before-the-swap").rc == 0


def test_list_names_only_session_directories_with_legal_names(world: World):
    """S-1, R-3, T-3: in its ``session/`` directory the agent makes directories whose names
    hold an escape sequence, a newline, bytes that are not UTF-8, a leading dot or dash, 65
    characters or ``.d``, and legal names that are a FIFO, a file, a link to a directory and
    a link to /dev/zero.  ``list`` (text and ``--json``) names only the legal directories,
    ``quiet`` among them; ``show``, ``tail --follow`` and ``repair`` of a legal name that is
    no directory are ``ENOTDIR`` naming it, at once."""
    record(world, "listed")
    sessions = world.session_dir("listed").parent
    outside = world.top / "elsewhere" / "linked-target"
    outside.mkdir(parents=True)
    illegal = [b"evil\x1b]0;owned\x07", b"a\nb", b"x.d", b".hidden", b"-dash", b"A" * 65,
               b"\xff\xfe"]  # fmt: skip
    for name in [*illegal, b"quiet"]:
        os.mkdir(os.path.join(os.fsencode(sessions), name), 0o700)
    os.mkfifo(sessions / "pipe")
    (sessions / "plain").write_text("not a session\n")
    (sessions / "linked").symlink_to(outside)
    (sessions / "zero").symlink_to("/dev/zero")
    for entry in os.listdir(os.fsencode(sessions)):
        os.lchown(os.path.join(os.fsencode(sessions), entry), world.user.uid, world.user.gid)

    text = world.session("list", AGENT)
    assert text.rc == 0, text
    assert_clean(text)
    names = text.lines()
    legal_dirs = sorted(
        name
        for name in os.listdir(sessions)
        if is_object_name(name) and stat.S_ISDIR(os.lstat(sessions / name).st_mode)
    )
    assert names == legal_dirs and {"listed", "quiet"} <= set(names), text
    assert not {"pipe", "plain", "linked", "zero"} & set(names), text
    as_json = world.session("list", AGENT, "--json")
    assert as_json.rc == 0, as_json
    assert strict_json(as_json.out) == [{"name": n, "path": str(sessions / n)} for n in names]

    for name, args in (("pipe", ("show",)), ("linked", ("tail", "-f", "--json")),
                       ("zero", ("repair", "--json")), ("plain", ("show", "--json"))):  # fmt: skip
        r = world.session(*args, AGENT, name, timeout=60)
        assert_error(r, "ENOTDIR", sessions / name, as_json="--json" in args)
    assert (sessions / "plain").read_text() == "not a session\n"


# ------------------------------------------------------------------ torn lines and repair


TORN = {
    "a fragment": b'{"ts":"2026-06-22T12:00:00Z","type":"tool_res',
    "a whole event without its newline": line(event("unterminated"))[:-1],
    "three megabytes after damaged lines": b'{"ts":"2026-06-22T12:00:00Z","p":"' + b"t" * (3 << 20),
    "the whole file": b'{"ts":"2026-06-22T12:00:00Z","type":"tool_call"}',
}


@pytest.mark.parametrize("torn_case", list(TORN))
def test_repair_cuts_the_torn_last_line_and_only_it(world: World, torn_case: str):
    """S-5 (readers ignore a torn last line, ``ctx session repair`` truncates it), docs/
    sessions.md (a longer unterminated last line is a torn line like any other): after whole
    events the agent wrote (and, in one case, damaged lines: not UTF-8, 1 MiB long), the file
    ends with a
    torn line — a fragment, a whole event without its newline, 3 MiB (after the damaged
    lines), or nothing else at all.
    ``show --json`` prints the whole events and names the torn line's size; ``repair --json``
    reports exactly that many bytes and leaves exactly what came before, owner and mode too;
    a second ``repair`` has nothing to do and changes nothing, not even the file's time."""
    session = "torn-" + str(list(TORN).index(torn_case))
    before = line(GOOD[0]) + line(GOOD[1])
    if torn_case.endswith("after damaged lines"):
        before += b'{"ts":"\xff"}\n' + b"d" * (1 << 20) + b"\n" + line(GOOD[2])
    elif torn_case == "the whole file":
        before = b""
    torn = TORN[torn_case]
    events = written(world, session, before + torn)
    owner = fingerprint(events)[3:]

    shown = world.session("show", AGENT, session, "--json")
    assert shown.rc == 0, shown
    assert_clean(shown)
    assert json_lines(shown.out) == read_jsonl_strict(before), shown
    assert f"ends with a torn line of {len(torn)} bytes" in shown.err, shown
    repaired = world.session("repair", AGENT, session, "--json")
    assert repaired.rc == 0, repaired
    report = strict_json(repaired.out)
    assert report["truncated_bytes"] == len(torn), report
    assert report["session"] == f"home/{world.user.uid}/agent/{AGENT}/session/{session}", report
    assert events.read_bytes() == before
    assert fingerprint(events)[3:] == owner

    untouched = fingerprint(events)
    again = world.session("repair", AGENT, session)
    assert again.rc == 0 and again.out.startswith("nothing to do"), again
    assert fingerprint(events) == untouched


def read_jsonl_strict(data: bytes) -> list:
    """The events of whole lines: each line that parses to an object with ``ts``."""
    found = []
    for raw in data.split(b"\n"):
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict) and "ts" in value:
            found.append(value)
    return found


# A writer that appends as docs/sessions.md says appenders do (O_APPEND, a shared flock for
# the write), its line in two writes so that the test sees it in flight: half a line is on
# disk while the lock is held.  Once the file ``go`` exists it writes the rest and lets go.
HALTING_WRITER = """
import fcntl, os, sys, time
path, first, rest, go = sys.argv[1:5]
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
fcntl.flock(fd, fcntl.LOCK_SH)
os.write(fd, first.encode())
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
os.write(fd, rest.encode())
fcntl.flock(fd, fcntl.LOCK_UN)
"""


def halting_writer(world: World, events: Path, text: str, go: Path) -> subprocess.Popen:
    half = len(text) // 2
    argv = [SYSTEM_PYTHON, "-c", HALTING_WRITER, str(events), text[:half], text[half:], str(go)]
    return subprocess.Popen(argv, user=world.user.uid, group=world.user.gid, extra_groups=[],
                            start_new_session=True)  # fmt: skip


def holds_open(pid: int, path: Path) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                    return True
    return False


def test_repair_racing_an_append_in_flight_cuts_nothing_and_a_dead_writers_fragment_only(
    world: World,
):
    """S-5, docs/sessions.md (each append holds a shared flock for its write; repair takes the
    exclusive lock, so it never cuts a line being written): a writer holding the lock has
    half of its line on disk.  ``show`` meanwhile prints the whole events and names the
    unfinished line as torn; a ``repair`` started then waits, and once the writer finishes
    reports 0 bytes, the line whole.  A second writer is killed (SIGKILL) with half its line
    written: its lock dies with it, and ``repair`` cuts exactly that half."""
    events = record(world, "in-flight")
    whole = events.read_bytes()
    go = world.top / "go-in-flight"
    first = line(event("appended", pad="p" * 3000)).decode()
    writer = halting_writer(world, events, first, go)
    repair = None
    try:
        assert wait_for(lambda: events.stat().st_size == len(whole) + len(first) // 2, 30)
        shown = world.session("show", AGENT, "in-flight", "--json")
        assert shown.rc == 0 and json_lines(shown.out) == read_jsonl_strict(whole), shown
        assert f"torn line of {len(first) // 2} bytes" in shown.err, shown
        repair = subprocess.Popen([*CTX_ARGV, "session", "repair", AGENT, "in-flight", "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
                                  start_new_session=True)  # fmt: skip
        assert wait_for(lambda: holds_open(repair.pid, events) or repair.poll() is not None, 30)
        go.touch()
        out, err = repair.communicate(timeout=60)
        assert repair.returncode == 0, err
        assert strict_json(out.decode())["truncated_bytes"] == 0, out
        assert writer.wait(timeout=60) == 0
    finally:
        go.touch()
        for proc in (writer, repair):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert events.read_bytes() == whole + first.encode()

    second = line(event("killed", pad="k" * 3000)).decode()
    dead = halting_writer(world, events, second, world.top / "go-never")
    try:
        grown = len(whole) + len(first) + len(second) // 2
        assert wait_for(lambda: events.stat().st_size == grown, 30)
    finally:
        dead.kill()
        dead.wait()
    r = world.session("repair", AGENT, "in-flight", "--json")
    assert r.rc == 0 and r.json()["truncated_bytes"] == len(second) // 2, r
    assert events.read_bytes() == whole + first.encode()
    r = world.session("show", AGENT, "in-flight", "--json")
    assert r.rc == 0 and json_lines(r.out)[-1]["type"] == "appended" and r.err == "", r


# ------------------------------------------------------------------ tail --follow


def test_follow_reads_a_replaced_file_from_its_start_and_a_finished_line_once(world: World):
    """S-5, docs/sessions.md ("a file … that another file replaces is read again from its
    start, after a note on stderr"; ``tail --follow`` runs until Ctrl-C, exit 0): a follower
    prints the session; the agent renames a new file with two events over events.jsonl (the
    follower says so and prints both), then writes half an event and, later, the rest: the
    event is printed once, whole.  Every line printed is JSON."""
    events = record(world, "followed")
    start = events_in(events)
    with following(world, AGENT, "followed", "-n", "10", "--json") as (proc, out, err):
        assert wait_for(lambda: out.read_bytes().count(b"\n") == 2, 30), out.read_bytes()
        replacement = world.session_dir("followed") / "replacement.tmp"
        put(world, replacement, line(GOOD[0]) + line(GOOD[1]))
        as_agent(world, 'mv -T "$1" "$2"', replacement, events)
        assert wait_for(lambda: out.read_bytes().count(b"\n") == 4, 30), out.read_bytes()
        assert "was replaced by another file: following it again from its start" in (
            err.read_text()
        )
        torn = line(GOOD[2])
        put(world, events, torn[:20], append=True)
        time.sleep(0.5)  # several polls see the unfinished line
        put(world, events, torn[20:], append=True)
        assert wait_for(lambda: out.read_bytes().count(b"\n") == 5, 30), out.read_bytes()
        time.sleep(0.5)  # nothing more comes
        assert interrupted(proc) == 0
        assert json_lines(out.read_text()) == [*start, GOOD[0], GOOD[1], GOOD[2]]
        assert "Traceback" not in err.read_text()


@pytest.mark.parametrize("swap", ["link to a root-only file", "FIFO"])
def test_follow_ends_with_an_error_when_the_file_is_swapped_for_no_regular_file(
    world: World, swap: str
):
    """S-5, docs/sessions.md (the commands never read through a link; events.jsonl must be a
    regular file): while ``tail --follow --json`` runs as root, the agent renames a link to a
    root-only file, or a FIFO, over its events.jsonl.  The follower neither prints the
    root-only file nor hangs on the FIFO: it ends with exit 1 and ``EINVAL`` naming the
    file, the error as the last JSON line of its output."""
    session = "swapped-link" if swap.startswith("link") else "swapped-fifo"
    events = written(world, session, line(GOOD[0]) + line(GOOD[1]))
    secret = root_only_secret(world, f"{session}.jsonl")
    planted = world.session_dir(session) / "planted.tmp"
    make = f'ln -s {secret} "$1"' if swap.startswith("link") else 'mkfifo "$1"'
    with following(world, AGENT, session, "--json") as (proc, out, err):
        assert wait_for(lambda: out.read_bytes().count(b"\n") == 2, 30), out.read_bytes()
        as_agent(world, f'{make} && mv -T "$1" "$2"', planted, events)
        assert wait_for(lambda: proc.poll() is not None, 30), "the follower went on"
        r = Run(["session", "tail", AGENT, session, "--json", "--follow"], proc.returncode,
                out.read_text(), err.read_text())  # fmt: skip
    assert_error(r, "EINVAL", events, as_json=True)
    assert SECRET not in r.out, r
    assert json_lines(r.out)[:2] == GOOD[:2] and len(r.lines()) == 3, r


# ------------------------------------------------------------------ another uid's sessions


def test_who_may_read_the_agents_sessions_root_a_member_and_an_outsider(world: World):
    """S-6, R-4, X-1 (docs/sessions.md: a home session is the agent's uid's alone; a shared
    session belongs to the space's group): the host administrator (root) reads the agent's
    home and shared sessions and may repair them; another uid in the space's group reads the
    shared session as root does but not the home one; a uid outside the group reads
    neither.  Each refusal is ``EACCES`` naming the directory that refused (one JSON object
    with ``--json``), and a refused ``repair`` leaves the torn line where it was."""
    home = record(world, "private")
    shared = record(world, "common", shared=True)
    for events in (home, shared):
        put(world, events, b'{"ts":"2026-06-22T12:00:00Z","ty', append=True)
    kept = {path: path.read_bytes() for path in (home, shared)}
    as_root = {
        "home": world.session("show", AGENT, "private", "--json"),
        "shared": world.session("show", AGENT, "common", "--project", SPACE, "--json"),
    }
    for r in as_root.values():
        assert r.rc == 0 and len(json_lines(r.out)) == 2 and "torn line" in r.err, r

    closed_home = world.storage / "home" / str(world.user.uid) / "agent"
    closed_space = world.storage / "shared" / SPACE
    member = world.stranger(21000, member=True)
    outsider = world.stranger(22000, member=False)
    cases = [
        (member, ["show", AGENT, "common", "--project", SPACE, "--json"], None),
        (member, ["list", AGENT, "--project", SPACE, "--json"], None),
        (member, ["show", AGENT, "private", "--uid", str(world.user.uid)], closed_home),
        (member, ["repair", AGENT, "private", "--json"], closed_home),
        (outsider, ["tail", AGENT, "common", "--project", SPACE, "--json"], closed_space),
        (outsider, ["repair", AGENT, "common", "--project", SPACE], closed_space),
        (outsider, ["list", AGENT, "--json"], closed_home),
    ]
    for (user, groups), args, refused_by in cases:
        done = run_as(user, [*CTX_ARGV, "session", *args], groups, env=world.env)
        r = Run(args, done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in r.err, r
        if refused_by is None:
            assert r.rc == 0, r
            if args[0] == "show":
                assert r.out == as_root["shared"].out, r
            continue
        assert r.rc == 1, r
        assert r.err.startswith(f"ctx: EACCES: cannot open {refused_by}: uid {user.uid} "), r
        if "--json" in args:
            assert strict_json(r.out)["error"] == "EACCES", r
    assert {path: path.read_bytes() for path in kept} == kept
    r = world.session("repair", AGENT, "common", "--project", SPACE, "--json")
    assert r.rc == 0 and r.json()["truncated_bytes"] == len(b'{"ts":"2026-06-22T12:00:00Z","ty')
    assert stat.S_IMODE(shared.stat().st_mode) == 0o660 and shared.stat().st_uid == world.user.uid


# ------------------------------------------------------------------ hostile names


HOSTILE_NAMES = {
    "controls": "evil\x1b]0;owned\x07\ntwo\rlines",
    "100k": "a" * 100_000,
    "dots-and-slashes": "../../..",
    "not-utf8": "\udcff\udcfe",
}


@pytest.mark.parametrize("name", list(HOSTILE_NAMES.values()), ids=list(HOSTILE_NAMES))
def test_an_illegal_name_is_a_usage_error_shown_escaped(world: World, name: str):
    """R-3 (anything but an object name is ``EINVAL``), T-3: an illegal name given as the
    session, as ``--session``, as the agent and as ``--project`` — holding an escape sequence,
    a newline and a CR, 100 000 characters, ``..`` and slashes, or bytes that are not UTF-8 —
    is exit 2
    with one ``ctx: EINVAL:`` line on stderr in which every control is escaped, with
    ``--json`` one JSON object on stdout, ``tail --follow`` not left running, and nothing
    made in the storage root."""
    before = sorted(str(p) for p in world.storage.rglob("*"))
    for args in (("show", AGENT, name), ("tail", AGENT, "--session", name, "--follow"),
                 ("repair", name, "default"), ("list", AGENT, "--project", name)):  # fmt: skip
        r = world.session(*args, "--json", timeout=60)
        assert r.rc == 2, r
        assert_clean(r)
        assert len(r.err.splitlines()) == 1 and r.err.startswith("ctx: EINVAL: "), r
        assert len(r.err) < 2000, len(r.err)  # a 100 000-character name is shortened
        assert strict_json(r.out)["error"] == "EINVAL", r
    assert sorted(str(p) for p in world.storage.rglob("*")) == before
