"""The error branches of sessions, their events and shared spaces, each reached from outside
(SPEC S-1, S-2, S-5, S-6, X-1, W-1, T-7; docs/sessions.md "Where sessions live", "Appending,
crash-safely", "Reading, torn lines and repair", "Commands", "Shared spaces"; the manual page
ctx.session; the help of ``ctx session`` and ``ctx shared create``).

The angle: every refusal that ``ctx session show``, ``tail`` (also ``--follow``), ``list`` and
``repair``, ``ctx shared create``, and the writers of events (``ctx run``, ``ctx queue work``)
may give, provoked as an operator or a member provokes it: a space that is missing, a file or
a link; a home that is closed; a session an older version made readable by the agent's group
and repaired by a member, or pinned by ``chattr``; an ``events.jsonl`` that is a FIFO, a
socket, a directory, a link or a hard link, or append-only with a torn line; a tool whose
failing post-hooks make its result too long for one event; a space whose directories belong
to other uids or lost their modes, holding hard links and sockets; a read-only filesystem.
Each check reads the exit status, the errno word of the ``ctx: ERRNO: sentence`` line (and the
same error as the ``--json`` object, or the ``--native`` result frame), that the message names
the thing at fault and what to do where the documents promise it, and that nothing was
half-done: files byte for byte and modes as they were, nothing made, no job claimed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.storage import attribute, copy_of_root, small_tmpfs
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="acts as the agent's and a member's uid, uses chattr: needs root"
)

AGENT = "coder"
LABEL = "coder_t"
SPACE = "sp"
TORN = b'{"ts":"2026-06-22T12:00:00Z","type":"tool_ca'
# A uid of no account: the kernel judges numbers, and a member needs none.
MEMBER_UID = 64123
ROOTS_GROUP = 0


# ----------------------------------------------------------------------------- common checks


def refused(r: Run, name: str, status: int = 1) -> str:
    """``r``, run with ``--json``, exited ``status`` with one error object on stdout whose
    errno is ``name``, and the same error as the last line of stderr; its message."""
    assert "Traceback" not in r.err, r
    assert r.rc == status, r
    lines = r.out.splitlines()
    assert len(lines) == 1, r
    obj = json.loads(lines[0])
    assert (obj["error"], obj["errno"]) == (name, getattr(errno, name)), r
    assert r.err.rstrip("\n").splitlines()[-1] == f"ctx: {name}: {obj['message']}", r
    return obj["message"]


def said(r: Run, name: str, status: int = 1) -> str:
    """``r`` (text mode) exited ``status``, its last stderr line ``ctx: NAME: …``; the
    message."""
    assert "Traceback" not in r.err, r
    assert r.rc == status, r
    last = r.err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"ctx: {name}: "), r
    return last.removeprefix(f"ctx: {name}: ")


def as_run(done: subprocess.CompletedProcess[str], argv: tuple[str, ...]) -> Run:
    return Run([str(a) for a in argv], done.returncode, done.stdout, done.stderr)


def modes(*paths: Path) -> list[tuple[int, int, int]]:
    """Mode, uid and gid of each path, links not followed."""
    return [(stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid) for s in (os.lstat(p) for p in paths)]


def make_socket(path: Path) -> None:
    """A listening-less UNIX socket bound at ``path`` (bound from its directory: the whole
    path may be longer than a socket address holds)."""
    script = "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
    subprocess.run([sys.executable, "-c", script, path.name], cwd=path.parent, check=True)


def plant(kind: str, at: Path, elsewhere: Path) -> None:
    """Something that is not a lone regular file at ``at``: ``elsewhere`` is the file a link
    or a hard link names."""
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "directory":
        at.mkdir()
    elif kind == "socket":
        make_socket(at)
    elif kind == "symlink":
        at.symlink_to(elsewhere)
    elif kind == "hardlink":
        os.link(elsewhere, at)
    else:  # pragma: no cover
        raise AssertionError(kind)


def frames(r: Run) -> list[dict]:
    return [json.loads(line) for line in r.out.splitlines() if line.strip()]


def lines_of(path: Path) -> list[dict]:
    """The events of a session file that are whole JSON lines."""
    found = []
    for line in path.read_bytes().split(b"\n"):
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


@dataclass
class World(OnStorage):
    """A storage root holding space ``sp`` (group: the agent's) and agent ``coder`` (the test
    user's uid) allowed ``fs.stat`` and ``shared:sp read write``."""

    storage: Path
    user: UnprivilegedUser
    workspace: Path

    @property
    def member(self) -> UnprivilegedUser:
        """Another uid, in the agent's group (a member of the space)."""
        return UnprivilegedUser(f"uid{MEMBER_UID}", MEMBER_UID, self.user.gid)

    def home_session(self, name: str = "default") -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / AGENT / "session" / name

    def space_session(self, name: str, space: str = SPACE) -> Path:
        return self.storage / "shared" / space / "agent" / AGENT / "session" / name

    def call(self, session: str = "default", *where: str) -> Run:
        """One real ``fs.stat`` call of the agent recorded in SESSION (``--project P`` in
        ``where`` for a space's session)."""
        r = self.ctx(
            "run", "--agent", AGENT, "--session", session, *where, "--native", "fs.stat",
            input=json.dumps({"path": "/workspace"}),
        )  # fmt: skip
        assert r.rc == 0, r
        return r

    def older(self, session: str) -> Path:
        """Home session SESSION as versions before 0700/0600 made it: every directory of its
        path below the home 0750, ``events.jsonl`` 0640; its directory."""
        directory = self.home_session(session)
        for level in (directory, *list(directory.parents)[:3]):
            level.chmod(0o750)
        (directory / "events.jsonl").chmod(0o640)
        return directory

    def as_member(self, *args: str) -> Run:
        """``ctx ARGS`` run by the member's uid with the agent's group."""
        done = run_as(self.member, (*CTX_ARGV, *args), [self.user.gid], env=self.env)
        return as_run(done, args)


@pytest.fixture
def world(searchable_storage: Path) -> World:
    user = find_or_create_user()
    workspace = searchable_storage.parent / "workspace"
    workspace.mkdir(mode=0o755)
    made = World(searchable_storage, user, workspace)
    r = made.ctx("shared", "create", SPACE, "--group", str(user.gid))
    assert r.rc == 0, r
    agent = {
        "name": AGENT, "label": LABEL, "tools": ["fs.stat"],
        "shared": {SPACE: ["read", "write"]}, "mount": [[str(workspace), "/workspace", "ro"]],
    }  # fmt: skip
    made.create_agent(agent, "--user", user.name)
    made.allow_tool(LABEL, "fs.stat")
    return made


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this file's own that every uid may search."""
    top = new_scratch_dir(scratch_top(__file__))
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------- readers: spaces that are not there


READERS = [
    ("list", AGENT),
    ("show", AGENT, "s1"),
    ("tail", AGENT, "s1"),
    ("tail", AGENT, "s1", "--follow"),
    ("repair", AGENT, "s1"),
]


def test_a_missing_space_is_enoent_naming_the_command_that_makes_it(world: World) -> None:
    """docs/sessions.md "Commands": a shared space that does not exist is ENOENT, exit 1,
    for every reader (``--follow`` included: nothing to wait for); nothing is made.  The
    message names the space and how to make it, and once it is made the listing is empty."""
    for argv in READERS:
        r = world.ctx("session", *argv, "--project", "nospace", "--json", timeout=20)
        message = refused(r, "ENOENT")
        assert "'nospace'" in message and "ctx shared create nospace" in message, r
        assert not (world.storage / "shared" / "nospace").exists()
    assert world.ctx("shared", "create", "nospace").rc == 0
    listed = world.ctx("session", "list", AGENT, "--project", "nospace", "--json")
    assert (listed.rc, json.loads(listed.out)) == (0, []), listed


def test_a_space_that_is_a_file_is_not_read_and_its_creation_names_the_file(
    world: World,
) -> None:
    """X-1, S-1: a regular file at ``shared/<name>`` is no space: readers find no session
    there (ENOENT, exit 1, the file as it was), and ``ctx shared create`` refuses to make a
    space through it (ENOTDIR naming it, "move it aside, nothing was changed")."""
    planted = world.storage / "shared" / "afile"
    planted.write_bytes(b"not a space\n")
    before = snapshot(world.storage / "shared")
    r = world.ctx("session", "show", AGENT, "s1", "--project", "afile", "--json")
    assert "'afile'" in refused(r, "ENOENT"), r
    made = world.ctx("shared", "create", "afile", "--json")
    message = refused(made, "ENOTDIR")
    assert str(planted) in message and "nothing was changed" in message, made
    assert snapshot(world.storage / "shared") == before


def test_a_space_that_is_a_link_is_never_followed_by_a_reader(world: World, scratch: Path) -> None:
    """docs/sessions.md "Appending, crash-safely": ``show``, ``tail``, ``repair`` and
    ``list`` reach a session by a walk that follows no link, so a link planted at
    ``shared/<name>`` leads none of them to read, or cut, a file elsewhere: ENOTDIR naming
    the link, exit 1, the file it points to byte for byte as it was."""
    elsewhere = scratch / "elsewhere"
    session = elsewhere / "agent" / AGENT / "session" / "s1"
    session.mkdir(parents=True)
    events = session / "events.jsonl"
    events.write_bytes(b'{"ts":"2026-06-22T12:00:00Z","type":"secret","agent":"x"}\n' + TORN)
    link = world.storage / "shared" / "linked"
    link.symlink_to(elsewhere)
    before = snapshot(elsewhere)
    for argv in READERS:
        if "--follow" in argv:
            continue
        r = world.ctx("session", *argv, "--project", "linked", "--json")
        assert str(link) in refused(r, "ENOTDIR"), r
        assert "secret" not in r.out
        assert snapshot(elsewhere) == before


# ---------------------------------------------------------- readers: homes closed to a caller


def test_a_closed_home_directory_is_eacces_saying_who_may_read_it(world: World) -> None:
    """ctx.session "ctx session": exit 1 when "a directory on the way is closed to you
    (EACCES, naming its whole path and who may read it)"; ``home/`` closed (0700, root's) is
    on the way to the sessions of an agent that does not exist (or is gone), whichever home
    holds them."""
    home = world.storage / "home"
    home.chmod(0o700)
    for argv in (("show", "ghost"), ("list", "ghost"), ("repair", "ghost"), ("tail", "ghost")):
        r = world.as_member("session", *argv, "--json")
        message = refused(r, "EACCES")
        assert str(home) in message, r
        assert "owner uid 0" in message and "mode 0700" in message, r


def test_a_closed_home_directory_named_by_uid_is_eacces_saying_who_may_read_it(
    world: World,
) -> None:
    """ctx.session "ctx session": the same closed ``home/`` on the way to an existing agent's
    sessions (its uid read from its identity) or to the home ``--uid`` names: EACCES, exit 1,
    naming the directory and who may read it; nothing changes."""
    world.call()
    home = world.storage / "home"
    home.chmod(0o700)
    before = snapshot(world.home_session())
    for argv in (("show", AGENT), ("list", "ghost", "--uid", str(world.user.uid))):
        r = world.as_member("session", *argv, "--json")
        message = refused(r, "EACCES")
        assert str(home) in message and "owner uid 0, group 0, mode 0700" in message, r
    assert snapshot(world.home_session()) == before


# ------------------------------------------------------------ repair: older modes, refusals


def test_a_member_may_read_an_older_home_session_but_its_repair_is_eperm_naming_it(
    world: World,
) -> None:
    """docs/sessions.md "Sessions made by older versions": what the home owner owns is
    changed only by root, "run as anyone else, bootstrap reports it as a problem, EPERM",
    and ``ctx session repair`` does the same.  A member of the agent's group still reads the
    session (0750) and is told of its torn line, with the repair command; its repair is
    EPERM naming the directory and ``ctx bootstrap`` as root, the torn line and every mode as
    they were.  Following the advice tightens the session (0700, 0600)."""
    world.call("old")
    directory = world.older("old")
    events = directory / "events.jsonl"
    with events.open("ab") as log:
        log.write(TORN)
    before = (events.read_bytes(), modes(directory, events))
    shown = world.as_member("session", "show", AGENT, "old", "--uid", str(world.user.uid))
    assert shown.rc == 0 and len(shown.lines()) == 2, shown
    repair = f"ctx session repair {AGENT} --session old --uid {world.user.uid}"
    assert f"torn line of {len(TORN)} bytes" in shown.err and repair in shown.err, shown
    r = world.as_member("session", "repair", AGENT, "old", "--uid", str(world.user.uid), "--json")
    message = refused(r, "EPERM")
    assert str(directory) in message and "0750" in message, r
    assert "run 'ctx bootstrap' as root" in message, r
    assert (events.read_bytes(), modes(directory, events)) == before
    booted = world.ctx("bootstrap", "--storage", world.storage)
    assert booted.rc == 0, booted
    assert f"home/{world.user.uid}/agent/{AGENT}/session/old (mode 0750 -> 0700)" in booted.out
    assert [m for m, _, _ in modes(directory, events)] == [0o700, 0o600]


def test_repair_of_an_older_session_whose_directory_is_immutable_names_it(world: World) -> None:
    """docs/sessions.md "Sessions made by older versions", "Reading, torn lines and repair":
    repair first takes the group's bits from an older home session; a directory pinned by
    ``chattr +i`` refuses that, to root too.  The refusal must name the directory (and the
    attribute that refuses), and change nothing."""
    world.call("pinned")
    directory = world.older("pinned")
    events = directory / "events.jsonl"
    with events.open("ab") as log:
        log.write(TORN)
    before = (events.read_bytes(), modes(directory, events))
    with attribute(directory, "i"):
        r = world.ctx("session", "repair", AGENT, "pinned", "--json")
        after = (events.read_bytes(), modes(directory, events))
    assert after == before
    message = refused(r, "EPERM")
    assert str(directory) in message and "immutable" in message, r


@pytest.mark.parametrize("case", ["immutable", "foreign"])
def test_repair_refused_by_its_events_file_says_what_it_tightened_before(
    world: World, case: str
) -> None:
    """docs/sessions.md "Appending, crash-safely" and ``ctx session repair --help``: a repair
    refused after it tightened the modes says so, since they stay tightened.  An
    ``events.jsonl`` made immutable (repaired by root) or left root's and unreadable (repaired
    by the agent's own uid) refuses its part of the repair: the error names the file, and the
    directory is either left 0750 or the error says it tightened it."""
    world.call("half")
    directory = world.older("half")
    events = directory / "events.jsonl"
    with events.open("ab") as log:
        log.write(TORN)
    before = events.read_bytes()
    args = ("session", "repair", AGENT, "half", "--uid", str(world.user.uid), "--json")
    if case == "immutable":
        with attribute(events, "i"):
            r = world.ctx(*args)
        name = "EPERM"
    else:
        os.chown(events, 0, ROOTS_GROUP)
        done = run_as(world.user, (*CTX_ARGV, *args), [world.user.gid], env=world.env)
        r = as_run(done, args)
        name = "EACCES"
    message = refused(r, name)
    assert events.read_bytes() == before
    assert str(events) in message, r
    mode = stat.S_IMODE(directory.stat().st_mode)
    assert mode == 0o750 or f"tightened {directory} (mode 0750 -> 0700)" in message, r


def test_repair_refused_after_tightening_says_so_and_leaves_what_is_planted(
    world: World, scratch: Path
) -> None:
    """docs/sessions.md "Reading, torn lines and repair": a FIFO, a socket, a directory or a
    link at ``events.jsonl`` is EINVAL for repair ("is not a regular file", "is a symbolic
    link"), exit 1.  In an older home session the directory was tightened first: it stays
    0700, the text output lists it, the refusal ends with "(before that, it tightened PATH
    (mode 0750 -> 0700))", and what is planted, or what a link names, is as it was."""
    world.call()
    target = scratch / "target.jsonl"
    target.write_bytes(b'{"ts":"2026-06-22T12:00:00Z","type":"x"}\n' + TORN)
    for kind in ("fifo", "directory", "socket", "symlink"):
        directory = world.home_session(kind)
        directory.mkdir()
        os.chown(directory, world.user.uid, world.user.gid)
        plant(kind, directory / "events.jsonl", target)
        directory.chmod(0o750)
        before = (target.read_bytes(), snapshot(directory))
        r = world.ctx("session", "repair", AGENT, kind)
        message = said(r, "EINVAL")
        tightened = f"{directory} (mode 0750 -> 0700)"
        assert message.endswith(f"(before that, it tightened {tightened})"), r
        assert f"tightened {tightened}" in r.out, r
        assert str(directory / "events.jsonl") in message, r
        assert (target.read_bytes(), snapshot(directory)) == before
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_an_immutable_events_file_is_repaired_only_when_nothing_is_torn(world: World) -> None:
    """docs/sessions.md "Reading, torn lines and repair": a file that may be read but not
    written has nothing to do when its last line is whole (exit 0); a torn line there cannot
    be cut: the refusal (EPERM for ``chattr +i``, which refuses root too) names the file, the
    torn bytes, the attribute and the ``chattr -i`` that lifts it, nothing changed."""
    world.call()
    events = world.home_session() / "events.jsonl"
    with attribute(events, "i"):
        whole = world.ctx("session", "repair", AGENT, "--json")
        assert whole.rc == 0 and whole.json()["truncated_bytes"] == 0, whole
    with events.open("ab") as log:
        log.write(TORN)
    before = events.read_bytes()
    with attribute(events, "i"):
        r = world.ctx("session", "repair", AGENT, "--json")
        assert events.read_bytes() == before
    message = refused(r, "EPERM")
    assert str(events) in message and f"torn line of {len(TORN)} bytes" in message, r
    assert "immutable" in message and f"chattr -i {events}" in message, r
    assert "nothing was changed" in message, r


def test_on_a_read_only_filesystem_repair_leaves_older_modes_and_refuses_a_cut(
    searchable_storage: Path, scratch: Path
) -> None:
    """docs/sessions.md: an older home session is tightened by repair, "on a read-only
    filesystem it is left as it is"; there repair of a whole last line has nothing to do
    (exit 0) and a torn line cannot be cut (EROFS, exit 1, naming the file and the torn
    bytes, nothing changed)."""
    user = find_or_create_user()
    with small_tmpfs(scratch / "disk", "32m", mode=0o755) as disk:
        world = World(copy_of_root(searchable_storage, disk / "storage"), user, scratch)
        world.create_agent(
            {"name": AGENT, "label": LABEL, "tools": ["fs.stat"],
             "mount": [[str(scratch), "/workspace", "ro"]]},
            "--user", user.name,
        )  # fmt: skip
        world.allow_tool(LABEL, "fs.stat")
        world.call("ro")
        directory = world.older("ro")
        events = directory / "events.jsonl"
        try:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            whole = world.ctx("session", "repair", AGENT, "ro", "--json")
            assert whole.rc == 0, whole
            answer = whole.json()
            assert (answer["truncated_bytes"], answer["tightened"]) == (0, []), whole
            assert [m for m, _, _ in modes(directory, events)] == [0o750, 0o640]
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
            with events.open("ab") as log:
                log.write(TORN)
            before = events.read_bytes()
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            r = world.ctx("session", "repair", AGENT, "ro", "--json")
            message = refused(r, "EROFS")
            assert str(events) in message and f"torn line of {len(TORN)} bytes" in message, r
            assert events.read_bytes() == before
            assert [m for m, _, _ in modes(directory, events)] == [0o750, 0o640]
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=False)


def test_a_follower_whose_session_directory_is_closed_ends_with_eacces_naming_it(
    world: World, tmp_path: Path
) -> None:
    """docs/sessions.md "Commands": "a file or directory it may no longer read ends it with
    that error (EACCES, exit 1), naming the path", once what it held is printed.  A member
    follows a shared session; the session directory is closed to the group (02700)."""
    world.call("s1", "--project", SPACE)
    directory = world.space_session("s1")
    out, err = tmp_path / "out", tmp_path / "err"
    argv = [*CTX_ARGV, "session", "tail", AGENT, "s1", "--project", SPACE, "-f", "--json"]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        follower = subprocess.Popen(
            argv, env=world.env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            user=MEMBER_UID, group=world.user.gid, extra_groups=[world.user.gid],
        )  # fmt: skip
    try:
        assert wait_for(lambda: len(out.read_bytes().splitlines()) == 2, 20), err.read_text()
        directory.chmod(0o2700)
        follower.wait(timeout=20)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        directory.chmod(0o3770)
    r = Run(argv, follower.returncode, out.read_text(), err.read_text())
    message = said(r, "EACCES")
    assert str(directory) in message and "mode 2700" in message, r
    printed = [json.loads(line) for line in r.lines()]
    assert [e.get("type") for e in printed[:-1]] == ["tool_call", "tool_result"], r
    assert (printed[-1]["error"], printed[-1]["message"]) == ("EACCES", message), r


# ------------------------------------------------------------------ writers of events


def test_a_worker_on_an_append_only_log_with_a_torn_line_names_its_session(
    world: World,
) -> None:
    """docs/workers.md, ``ctx queue work --help``: a worker whose session log is append-only
    (``chattr +a``) with a torn last line cannot cut it (the next appender cuts it before its
    first append, S-5): it stops before claiming, EPERM naming its session and how to lift
    the attribute; the job stays pending, the log byte for byte as it was."""
    world.call("worker")
    events = world.home_session("worker") / "events.jsonl"
    with events.open("ab") as log:
        log.write(TORN)
    queue = QueueCLI(world.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/workspace"}), name="stat")
    before = events.read_bytes()
    with attribute(events, "a"):
        r = queue.run("work", "--agent", AGENT, "--drain", "--json", timeout=60)
        assert events.read_bytes() == before
    assert "Traceback" not in r.err and r.rc == 1, r
    last = json.loads(r.out.splitlines()[-1])
    assert last["error"] == "EPERM", r
    assert str(world.home_session("worker")) in last["message"], r
    assert "chattr -i -a" in last["message"] and "no job was claimed" in last["message"], r
    assert queue.state(job) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


def test_a_call_on_an_append_only_log_with_a_torn_line_names_the_log(world: World) -> None:
    """docs/sessions.md "Reading, torn lines and repair": the next appender cuts a torn line
    before its first append; an append-only file refuses the cut, to root too.  The call is
    refused before the tool runs (native: the result frame's error; text: exit 126), and the
    refusal names the session's file and the attribute; nothing is written anywhere."""
    world.call()
    events = world.home_session() / "events.jsonl"
    log = world.storage / "tool" / "fs.stat.d" / "log"
    with events.open("ab") as opened:
        opened.write(TORN)
    before = (events.read_bytes(), log.read_bytes())
    with attribute(events, "a"):
        native = world.ctx(
            "run", "--agent", AGENT, "--native", "fs.stat", input='{"path": "/workspace"}'
        )
        text = world.ctx("run", "--agent", AGENT, "fs.stat", "/workspace")
        assert (events.read_bytes(), log.read_bytes()) == before
    assert "Traceback" not in native.err + text.err
    result = frames(native)[-1]
    assert result["type"] == "result" and result["status"] == "error", native
    error = result["error"]
    assert (error["error"], error["stage"]) == ("EPERM", "session"), native
    message = said(text, "EPERM", 126)
    for shown in (error["message"], message):
        assert str(events) in shown and "append-only" in shown, (shown, native, text)


def test_a_worker_whose_session_log_is_no_lone_regular_file_claims_nothing(
    world: World, scratch: Path
) -> None:
    """docs/sessions.md "Appending, crash-safely": ``events.jsonl`` must be a regular file of
    one name; the host never appends through a link, to a FIFO or to another file's second
    name (EINVAL).  A worker meets it when it opens its session: it says so naming the
    session and "no job was claimed", exit 1; the job stays pending and what is planted, and
    the file a link names, are as they were."""
    world.call()
    directory = world.home_session("worker")
    directory.mkdir(mode=0o700)
    os.chown(directory, world.user.uid, world.user.gid)
    other = scratch / "other.jsonl"
    other.write_bytes(b'{"ts":"2026-06-22T12:00:00Z","type":"x"}\n')
    queue = QueueCLI(world.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/workspace"}), name="stat")
    for kind in ("fifo", "directory", "socket", "symlink", "hardlink"):
        plant(kind, directory / "events.jsonl", other)
        before = (other.read_bytes(), snapshot(directory), snapshot(queue.dir))
        r = queue.run("work", "--agent", AGENT, "--drain", "--json", timeout=60)
        assert "Traceback" not in r.err and r.rc == 1, r
        last = json.loads(r.out.splitlines()[-1])
        assert last["error"] == "EINVAL", r
        message = last["message"]
        assert f"cannot open the worker's session {directory}" in message, r
        assert "no job was claimed" in message and str(directory / "events.jsonl") in message, r
        assert r.err.rstrip().endswith(message), r
        assert (other.read_bytes(), snapshot(directory), snapshot(queue.dir)) == before
        assert queue.state(job) == "pending"
        planted = directory / "events.jsonl"
        if planted.is_dir() and not planted.is_symlink():
            planted.rmdir()
        else:
            planted.unlink()


def many_failing_post_hooks(world: World, count: int = 220) -> None:
    """``count`` post-hooks of ``fs.stat`` with names of 240 bytes, each a symbolic link: a
    failed hook (T-6), listed with its name in ``post_hooks`` of the call's result."""
    hooks = world.storage / "tool" / "fs.stat.d" / "hooks" / "post.d"
    hooks.mkdir(parents=True, exist_ok=True)
    for number in range(count):
        (hooks / f"h{number:03d}{'x' * 236}").symlink_to("/nonexistent")


def test_a_call_with_many_failed_post_hooks_still_records_its_result(world: World) -> None:
    """docs/sessions.md "Events": "A recorded tool_call always gets its tool_result, whatever
    goes wrong after it" (only a session that cannot be written at all keeps it without),
    and the same result is one line of the tool's log (T-7); a post-hook's exit status is
    recorded with the call and changes nothing (docs/tools.md)."""
    many_failing_post_hooks(world)
    r = world.ctx("run", "--agent", AGENT, "--native", "fs.stat", input='{"path": "/workspace"}')
    assert "Traceback" not in r.err, r
    call = frames(r)[0]["call"]
    session = lines_of(world.home_session() / "events.jsonl")
    assert [e["type"] for e in session if e.get("call") == call] == ["tool_call", "tool_result"]
    log = lines_of(world.storage / "tool" / "fs.stat.d" / "log")
    assert [e["type"] for e in log if e.get("call") == call] == ["tool_result"]


def test_a_worker_job_with_many_failed_post_hooks_is_no_unrecorded_outcome(world: World) -> None:
    """docs/tools.md stage ``record``, docs/workers.md: an unlogged call is no job's outcome.
    Either the call is recorded whole (its tool_result in the worker's session) and the job
    finished by it, or it is not and the job stays claimed for ``ctx queue recover``."""
    many_failing_post_hooks(world)
    queue = QueueCLI(world.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/workspace"}), name="stat")
    r = queue.run("work", "--agent", AGENT, "--drain", "--json", timeout=60)
    assert "Traceback" not in r.err, r
    session = lines_of(world.home_session("worker") / "events.jsonl")
    calls = [e["call"] for e in session if e.get("type") == "tool_call" and e.get("job") == job]
    assert len(calls) == 1, session
    results = [e for e in session if e.get("type") == "tool_result" and e["call"] == calls[0]]
    state = queue.state(job)
    assert (state == "claimed" and not results) or (state in ("done", "failed") and results), (
        state,
        r,
    )


# ------------------------------------------------------------------ shared create


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_root_entry_shared_that_is_no_directory_is_in_the_way(
    storage: Path, scratch: Path, kind: str
) -> None:
    """docs/sessions.md "Shared spaces": each directory is reached without following a link;
    ``shared/`` that is a link or a file is ENOTDIR naming it "the root entry shared/",
    exit 1, before anything is made: the link's target and the root as they were."""
    shared = storage / "shared"
    target = scratch / "shared"
    shutil.move(shared, target)
    if kind == "symlink":
        shared.symlink_to(target)
    else:
        shared.write_bytes(b"")
    before = (snapshot(storage), snapshot(target))
    r = ctx_run("shared", "create", "fresh", "--storage", storage, "--json")
    message = refused(r, "ENOTDIR")
    assert str(shared) in message and "the root entry shared/" in message, r
    assert "nothing was changed" in message, r
    assert (snapshot(storage), snapshot(target)) == before


def test_a_link_at_a_spaces_agent_directory_is_in_the_way(storage: Path, scratch: Path) -> None:
    """X-1, docs/sessions.md "Shared spaces": a space whose ``agent/`` a member swapped for a
    link is not completed through it: ENOTDIR naming it, nothing made there or elsewhere."""
    assert ctx_run("shared", "create", "lk", "--storage", storage).rc == 0
    agent = storage / "shared" / "lk" / "agent"
    agent.rmdir()
    outside = scratch / "outside"
    outside.mkdir()
    agent.symlink_to(outside)
    before = (snapshot(storage / "shared" / "lk"), snapshot(outside))
    r = ctx_run("shared", "create", "lk", "--storage", storage, "--json")
    assert str(agent) in refused(r, "ENOTDIR"), r
    assert (snapshot(storage / "shared" / "lk"), snapshot(outside)) == before


@pytest.mark.parametrize(
    ("group", "said_of_it"),
    [
        ("no-such-group-zz", "no such group: 'no-such-group-zz'"),
        ("4294967295", "is not a group id (at most 4294967294)"),
        ("99999999999999999999", "is not a group id"),
    ],
)
def test_a_group_that_names_none_is_a_usage_error_and_nothing_is_made(
    storage: Path, group: str, said_of_it: str
) -> None:
    """``ctx shared create --help``: --group is a group's name or gid; anything else is a
    malformed command line (EINVAL, exit 2), and no space is made."""
    before = snapshot(storage / "shared")
    r = ctx_run("shared", "create", "g", "--group", group, "--storage", storage, "--json")
    assert said_of_it in refused(r, "EINVAL", 2), r
    assert snapshot(storage / "shared") == before


def test_a_storage_root_the_caller_may_not_make_is_eacces_and_nothing_is_made(
    scratch: Path,
) -> None:
    """docs/sessions.md "Shared spaces": a storage root that does not exist is made whole
    first; one the caller may not make (its parent root's, 0755) is EACCES naming the
    directory and what to do, exit 1, and nothing is made."""
    member = UnprivilegedUser(f"uid{MEMBER_UID}", MEMBER_UID, MEMBER_UID)
    root = scratch / "a" / "storage"
    (scratch / "a").mkdir(mode=0o755)
    argv = ("shared", "create", "x", "--storage", str(root), "--json")
    r = as_run(run_as(member, (*CTX_ARGV, *argv), env=clean_env()), argv)
    message = refused(r, "EACCES")
    assert f"cannot create {root}" in message and "--storage DIR or CTX_STORAGE" in message, r
    assert os.listdir(scratch / "a") == []


def test_without_group_older_session_modes_are_named_and_the_named_command_repairs_them(
    world: World,
) -> None:
    """docs/sessions.md "Shared spaces": a space's session directories an older version made
    02770 are left as they are by ``ctx shared create NAME`` (no --group), which warns naming
    the first and ``ctx shared create NAME --group G``; that command, run as written, gives
    each the setgid and sticky bits (``repaired  PATH (mode 2770 -> 3770)``)."""
    world.call("s1", "--project", SPACE)
    session = world.space_session("s1")
    levels = [session, session.parent, session.parent.parent]
    for level in levels:
        level.chmod(0o2770)
    r = world.ctx("shared", "create", SPACE)
    assert r.rc == 0 and "Traceback" not in r.err, r
    warning = r.err.strip().splitlines()[-1]
    assert warning.startswith(f"ctx: warning: shared space {SPACE}: "), r
    assert f"{levels[-1]} has mode 2770, not 3770 (and 2 more)" in warning, r
    assert [m for m, _, _ in modes(*levels)] == [0o2770] * 3
    named = warning.split("run '", 1)[1].split("'", 1)[0]
    words = shlex.split(named)
    assert words[:3] == ["ctx", "shared", "create"], warning
    repaired = world.ctx(*words[1:], "--json")
    assert repaired.rc == 0, repaired
    assert sorted(repaired.json()["sessions_repaired"]) == sorted(
        f"{level} (mode 2770 -> 3770)" for level in levels
    ), repaired
    assert [m for m, _, _ in modes(*levels)] == [0o3770] * 3


def test_a_link_planted_among_session_directories_is_not_followed_by_a_repair(
    world: World, scratch: Path
) -> None:
    """docs/sessions.md "Shared spaces": ``--group G`` gives each session directory the bits
    it lacks "through descriptors, following no link": a member's link in ``agent/`` to a
    directory of mode 02770 elsewhere leaves that directory's mode as it was."""
    outside = scratch / "outside"
    (outside / "session" / "s1").mkdir(parents=True)
    for level in (outside, outside / "session", outside / "session" / "s1"):
        level.chmod(0o2770)
    (world.storage / "shared" / SPACE / "agent" / "evil").symlink_to(outside)
    r = world.ctx("shared", "create", SPACE, "--group", str(world.user.gid), "--json")
    assert r.rc == 0, r
    assert r.json()["sessions_repaired"] == [], r
    assert [m for m, _, _ in modes(outside, outside / "session")] == [0o2770, 0o2770]


@dataclass
class OwnedSpace:
    """A storage root and space ``own`` made by the agent's user (not root)."""

    storage: Path
    user: UnprivilegedUser

    @property
    def space(self) -> Path:
        return self.storage / "shared" / "own"

    def as_uid(self, uid: int, *args: str) -> Run:
        who = UnprivilegedUser(f"uid{uid}", uid, self.user.gid)
        env = clean_env(CTX_STORAGE=str(self.storage))
        return as_run(run_as(who, (*CTX_ARGV, *args), [self.user.gid], env=env), args)


@pytest.fixture
def owned_space(scratch: Path) -> OwnedSpace:
    user = find_or_create_user()
    top = scratch / "own"
    top.mkdir(mode=0o755)
    os.chown(top, user.uid, user.gid)
    made = OwnedSpace(top / "storage", user)
    booted = made.as_uid(user.uid, "bootstrap", "--storage", str(made.storage))
    assert booted.rc == 0, booted
    created = made.as_uid(user.uid, "shared", "create", "own")
    assert created.rc == 0, created
    return made


def test_the_space_owner_may_not_repair_another_uids_older_session_directory(
    owned_space: OwnedSpace,
) -> None:
    """``ctx shared create --help``: the session directories' missing bits are given by
    root, "anyone else only their own: EPERM, nothing changed".  The space's owner (not root)
    runs ``--group G`` over a member's session directories of mode 02770: EPERM naming the
    first, its uid and "have root run the command"; nothing of the space changes.  Root's run
    of the same command repairs all three."""
    space, gid = owned_space.space, owned_space.user.gid
    levels = [space / "agent" / "other", space / "agent" / "other" / "session"]
    levels.append(levels[-1] / "x")
    levels[-1].mkdir(parents=True)
    for level in levels:
        os.chown(level, MEMBER_UID, gid)
        level.chmod(0o2770)
    before = snapshot(space), [modes(p) for p in sorted(space.rglob("*"))]
    r = owned_space.as_uid(owned_space.user.uid, "shared", "create", "own", "--group", str(gid))
    message = said(r, "EPERM")
    assert f"{levels[0]} belongs to uid {MEMBER_UID} and has mode 2770, not 3770" in message, r
    assert "nothing was changed" in message and "have root run the command" in message, r
    assert (snapshot(space), [modes(p) for p in sorted(space.rglob("*"))]) == before
    env = clean_env(CTX_STORAGE=str(owned_space.storage))
    by_root = ctx_run("shared", "create", "own", "--group", str(gid), env=env)
    assert by_root.rc == 0, by_root
    for level in levels:
        assert f"repaired  {level} (mode 2770 -> 3770)" in by_root.out, by_root
    assert [m for m, _, _ in modes(*levels)] == [0o3770] * 3


def test_a_member_may_not_repair_the_owners_directory_of_another_mode(
    owned_space: OwnedSpace,
) -> None:
    """docs/sessions.md "Shared spaces": ``--group G`` repairs the space's own directories
    whose mode is not the one stated; run by a member (of the group, neither root nor the
    owner) over ``data/`` that lost its setgid bit, it is EPERM naming it and the uid that
    may change it, "nothing was changed"."""
    data = owned_space.space / "data"
    data.chmod(0o0770)
    before = snapshot(owned_space.space), modes(data)
    gid = str(owned_space.user.gid)
    r = owned_space.as_uid(MEMBER_UID, "shared", "create", "own", "--group", gid, "--json")
    message = refused(r, "EPERM")
    assert str(data) in message and "mode 0770 should be" in message, r
    assert f"only root or its owner, uid {owned_space.user.uid}, may change them" in message, r
    assert "nothing was changed" in message, r
    assert (snapshot(owned_space.space), modes(data)) == before


def test_a_regroup_keeps_a_hard_linked_file_and_lists_it(storage: Path, scratch: Path) -> None:
    """docs/sessions.md "Shared spaces": ``--group G`` for a space of another group gives G
    every entry of the old group, but files with other names (hard links, which may lie
    outside the space) keep it, "listed as kept"; the line says why, and the file's other
    name outside the space keeps its group."""
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("shared", "create", "hl", env=env).rc == 0
    outside = scratch / "outside"
    outside.write_bytes(b"not the space's\n")
    inside = storage / "shared" / "hl" / "data" / "inside"
    os.link(outside, inside)
    gid = find_or_create_user().gid
    r = ctx_run("shared", "create", "hl", "--group", str(gid), env=env)
    assert r.rc == 0, r
    assert f"group {ROOTS_GROUP} -> {gid}" in r.out, r
    assert (
        f"kept      {inside}: group {ROOTS_GROUP}, since it has other names (hard links), "
        "which may lie outside the space"
    ) in r.out, r
    assert os.stat(outside).st_gid == ROOTS_GROUP
    assert os.stat(storage / "shared" / "hl" / "data").st_gid == gid


def test_a_regroup_gives_a_socket_the_group_or_lists_it_kept(storage: Path) -> None:
    """``ctx shared create --help``: --group G for a space of another group "gives G every
    entry of the space that had its old group, never through a link; a file with other names
    … keeps it, as does what lies more than 256 directories deep, each listed as kept".  A
    member's service socket in ``data/`` is an entry whose group bits say who may connect."""
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("shared", "create", "sk", env=env).rc == 0
    socket_path = storage / "shared" / "sk" / "data" / "app.sock"
    make_socket(socket_path)
    socket_path.chmod(0o770)
    gid = find_or_create_user().gid
    r = ctx_run("shared", "create", "sk", "--group", str(gid), "--json", env=env)
    assert r.rc == 0, r
    kept = [entry["path"] for entry in r.json()["kept"]]
    assert os.lstat(socket_path).st_gid == gid or str(socket_path) in kept, r
