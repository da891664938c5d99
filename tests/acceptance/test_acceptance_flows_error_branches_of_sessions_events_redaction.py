"""The error branches of session readers, event appends, log redaction and shared spaces that
other flows leave unreached, each provoked from outside (SPEC S-1, S-2, S-4, S-5, S-6, X-1,
R-3; docs/sessions.md "Where sessions live", "Appending, crash-safely", "Reading, torn lines
and repair", "What logs may say (S-4)", "Commands", "Shared spaces"; the manual page
ctx.session; the help of ``ctx session`` and ``ctx shared create``).

The angle: every refusal, and every failure turned into an answer, that ``ctx session show``,
``tail`` (also ``--follow``), ``list`` and ``repair``, the appender behind ``ctx run`` and
``ctx shared create`` can give, met the way an operator, a member of a space or a container
meets it: a session directory that is a file, an ``events.jsonl`` that is a device node, that
a member may read but not write or not read at all, that is hard-linked, immutable or kept
locked; a root whose capability set lacks ``CAP_DAC_OVERRIDE`` or ``CAP_FOWNER``; a standard
output that refuses what is written; a ``shared/`` that may be written but not read; a space
whose queue holds a FIFO, a link or a bad config, whose name is a link or illegal, whose tree
is deeper than a regroup walks, or that a member completes; secrets of odd shapes in a call's
input.  Each check reads the exit status, the errno word of the ``ctx: ERRNO: sentence`` line
(and the same error as the ``--json`` object, or the ``--native`` result frame), that the
message names the thing at fault and what to do where the documents promise it, and that
nothing was half-done: files byte for byte, modes, owners and groups as they were, nothing
made, no event appended."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
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
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.storage import attribute, copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="acts as other uids, makes device nodes, uses chattr: needs root"
)

SCRATCH = scratch_top(__file__)
AGENT = "coder"
LABEL = "coder_t"
SPACE = "sp"
GHOST = "ghost"  # an agent that does not exist: its sessions are ordinary directories (S-1)
GHOST_UID = 4242  # a uid of no account: the kernel judges numbers
MEMBER_UID = 64151  # another account-less uid, a member of the space's group where given it
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
SYSTEM_PYTHON = "/usr/bin/python3"
R = "[redacted]"
EVENT = (
    b'{"ts":"2026-06-22T12:00:00Z","type":"note","agent":"ghost","session":"s1",'
    b'"object":"tool/fs.read","status":"ok"}\n'
)
TORN = b'{"ts":"2026-06-22T12:00:01Z","type":"tool_ca'
# Prints its JSON input back: what the call's output summary then holds is its input's.
ECHO = """#!/bin/sh
input=$(cat)
printf '%s\\n' "$input"
"""


# ----------------------------------------------------------------------------- common checks


def refused(r: Run, name: str, status: int = 1) -> str:
    """``r``, run with ``--json``, exited ``status`` with one error object on stdout whose
    errno is ``name``, the same error the last line of stderr; its message."""
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


def as_run(done: subprocess.CompletedProcess, argv: tuple[str, ...] | list[str]) -> Run:
    out, err = done.stdout, done.stderr
    if isinstance(out, bytes):
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return Run([str(a) for a in argv], done.returncode, out, err)


def env_of(storage: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage), PATH=PATH)


def member(gid: int) -> UnprivilegedUser:
    """The member's uid with primary group ``gid``."""
    return UnprivilegedUser(f"uid{MEMBER_UID}", MEMBER_UID, gid)


def as_member(storage: Path, gid: int, *args: str, timeout: float = 60) -> Run:
    """``ctx ARGS`` run by the member's uid, in group ``gid`` alone."""
    argv = [*CTX_ARGV, *args]
    done = subprocess.run(
        argv, capture_output=True, env=env_of(storage), cwd="/", timeout=timeout,
        user=MEMBER_UID, group=gid, extra_groups=[gid], stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return as_run(done, args)


def to_full(storage: Path, *args: str) -> Run:
    """``ctx ARGS > /dev/full``: a standard output that refuses what is written."""
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [*CTX_ARGV, *args], stdout=full, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=env_of(storage), timeout=60,
        )  # fmt: skip
    return Run(list(args), done.returncode, "", done.stderr.decode("utf-8", "replace"))


def modes(*paths: Path) -> list[tuple[int, int, int]]:
    """Mode, uid and gid of each path, links not followed."""
    return [(stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid) for s in (os.lstat(p) for p in paths)]


def home_session(
    storage: Path,
    name: str,
    events: bytes | None,
    *,
    uid: int = GHOST_UID,
    gid: int = GHOST_UID,
    agent: str = GHOST,
    dir_mode: int = 0o700,
    file_mode: int = 0o600,
) -> Path:
    """``home/<uid>/agent/<agent>/session/<name>/`` as the runner makes it for ``uid`` (every
    level the agent's, below the home 0700), holding ``events`` as ``events.jsonl`` (none when
    None); the session directory ``dir_mode``, the file ``file_mode``.  The directory."""
    home = storage / "home" / str(uid)
    directory = home / "agent" / agent / "session" / name
    directory.mkdir(parents=True, exist_ok=True)
    home.chmod(0o755)
    os.chown(home, uid, gid)
    for level in (home / "agent", home / "agent" / agent, home / "agent" / agent / "session"):
        os.chown(level, uid, gid)
        level.chmod(0o700)
    os.chown(directory, uid, gid)
    directory.chmod(dir_mode)
    if events is not None:
        path = directory / "events.jsonl"
        path.write_bytes(events)
        os.chown(path, uid, gid)
        path.chmod(file_mode)
    return directory


def space_session(
    storage: Path, name: str, events: bytes, gid: int, *, file_mode: int = 0o660
) -> Path:
    """A session of agent ``ghost`` (uid 4242) in space ``sp`` (group ``gid``), as the runner
    makes it (03770, the events ``file_mode``); its ``events.jsonl``."""
    agent = storage / "shared" / SPACE / "agent" / GHOST
    directory = agent / "session" / name
    directory.mkdir(parents=True, exist_ok=True)
    for level in (agent, agent / "session", directory):
        os.chown(level, GHOST_UID, gid)
        level.chmod(0o3770)
    path = directory / "events.jsonl"
    path.write_bytes(events)
    os.chown(path, GHOST_UID, gid)
    path.chmod(file_mode)
    return path


def group_of_test_user() -> int:
    return find_or_create_user().gid


@pytest.fixture
def root(searchable_storage: Path) -> Path:
    """A bootstrapped storage root every uid may search, holding space ``sp`` of the test
    user's group."""
    made = ctx_run("shared", "create", SPACE, "--group", str(group_of_test_user()),
                   env=env_of(searchable_storage))  # fmt: skip
    assert made.rc == 0, made
    return searchable_storage


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = new_scratch_dir(SCRATCH)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def ctx(storage: Path, *args: str, **kw) -> Run:
    kw.setdefault("env", env_of(storage))
    return ctx_run(*args, **kw)


# ------------------------------------------------------- readers: places that hold no session


def test_a_list_of_an_agent_that_is_not_names_the_place_that_holds_none(root: Path) -> None:
    """docs/sessions.md "Commands": "An agent that does not exist and has no sessions is
    ENOENT (exit 1)", in a space (``--project``) as in a home given by ``--uid``: the message
    names the agent's missing entry and the directory that holds no sessions of it, and
    nothing is made.  An agent directory kept there (its sessions removed) lists empty."""
    before = snapshot(root)
    for where, kept in (
        (("--project", SPACE), root / "shared" / SPACE / "agent" / GHOST),
        (("--uid", str(GHOST_UID)), root / "home" / str(GHOST_UID) / "agent" / GHOST),
    ):
        r = ctx(root, "session", "list", GHOST, *where, "--json")
        message = refused(r, "ENOENT")
        assert message == (
            f"there is no agent '{GHOST}' ({root / 'agent' / GHOST} does not exist), and "
            f"{kept} holds no sessions of it"
        ), r
        text = ctx(root, "session", "list", GHOST, *where)
        assert said(text, "ENOENT") == message and text.out == "", text
    assert snapshot(root) == before
    (root / "shared" / SPACE / "agent" / GHOST).mkdir()
    listed = ctx(root, "session", "list", GHOST, "--project", SPACE, "--json")
    assert (listed.rc, listed.out) == (0, "[]\n"), listed


def test_a_session_directory_that_is_a_file_is_enotdir_for_every_reader(root: Path) -> None:
    """docs/sessions.md "Appending, crash-safely": readers reach a session by a walk that
    opens every component without following it; a regular file where ``session/`` should be
    is ENOTDIR naming it for ``list``, ``show``, ``tail`` (``--follow`` too, at once) and
    ``repair``, exit 1, the file as it was."""
    home_session(root, "s1", EVENT)
    sessions = root / "home" / str(GHOST_UID) / "agent" / GHOST / "session"
    shutil.rmtree(sessions)
    sessions.write_bytes(b"not a directory\n")
    before = snapshot(root / "home")
    for argv in (("list",), ("show",), ("tail",), ("tail", "--follow"), ("repair",)):
        r = ctx(root, "session", *argv, GHOST, "--uid", str(GHOST_UID), "--json", timeout=20)
        message = refused(r, "ENOTDIR")
        assert message == f"{sessions} is not a directory (or is a symlink); left untouched", r
        assert snapshot(root / "home") == before


def test_a_device_node_at_events_jsonl_is_einval_for_every_reader(root: Path) -> None:
    """docs/sessions.md "Appending, crash-safely", ctx.session "Durability": ``events.jsonl``
    must be a regular file; a character device planted there (here one of /dev/null's
    numbers) is EINVAL "is not a regular file" for ``show``, ``tail`` (also ``--follow``)
    and ``repair``, exit 1; the node is left as it was."""
    directory = home_session(root, "dev", None)
    node = directory / "events.jsonl"
    os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    for argv in (("show",), ("tail",), ("tail", "--follow"), ("repair",)):
        r = ctx(root, "session", *argv, GHOST, "dev", "--uid", str(GHOST_UID), "--json",
                timeout=20)  # fmt: skip
        assert refused(r, "EINVAL") == f"{node} is not a regular file", r
        status = os.lstat(node)
        assert stat.S_ISCHR(status.st_mode) and status.st_rdev == os.makedev(1, 3)
        assert stat.S_IMODE(status.st_mode) == 0o600


def test_tail_of_no_events_prints_none_and_still_names_the_torn_line(root: Path) -> None:
    """docs/sessions.md "Commands": ``tail -n`` is a count from 0; ``-n 0`` prints no event
    (exit 0) and, as every reader, mentions a torn last line with the repair command."""
    directory = home_session(root, "n0", EVENT + TORN)
    r = ctx(root, "session", "tail", GHOST, "n0", "--uid", str(GHOST_UID), "-n", "0")
    assert (r.rc, r.out) == (0, ""), r
    assert r.err == (
        f"ctx: note: {directory / 'events.jsonl'} ends with a torn line of {len(TORN)} bytes "
        f"(skipped; 'ctx session repair {GHOST} --session n0 --uid {GHOST_UID}' truncates it)\n"
    ), r


# --------------------------------------------------- readers: what a member may and may not do


def test_events_a_member_may_not_read_are_eacces_naming_the_file(root: Path) -> None:
    """docs/sessions.md "Commands": a reader refused by the kernel is EACCES, exit 1, naming
    the whole path.  A member of the space (who may enter the session, 03770) meets an
    ``events.jsonl`` of mode 0600 that is another uid's: ``show``, ``tail`` and ``repair``
    each name the file, and nothing changes."""
    gid = group_of_test_user()
    events = space_session(root, "closed", EVENT + TORN, gid, file_mode=0o600)
    before = (events.read_bytes(), modes(events, events.parent))
    for command in ("show", "tail", "repair"):
        r = as_member(root, gid, "session", command, GHOST, "closed", "--project", SPACE,
                      "--json")  # fmt: skip
        assert str(events) in refused(r, "EACCES"), r
        assert (events.read_bytes(), modes(events, events.parent)) == before


def test_repair_by_a_member_who_may_read_but_not_write_cuts_nothing(root: Path) -> None:
    """docs/sessions.md "Reading, torn lines and repair": run by a caller who may read the
    file but not write it, ``repair`` of a whole last line has nothing to do (exit 0); a torn
    line cannot be cut: EACCES, exit 1, naming the file and the torn bytes, nothing changed,
    saying who may repair it.  Doing that (root) cuts it."""
    gid = group_of_test_user()
    events = space_session(root, "ro", EVENT, gid, file_mode=0o640)
    argv = ("session", "repair", GHOST, "ro", "--project", SPACE, "--json")
    whole = as_member(root, gid, *argv)
    assert whole.rc == 0, whole
    assert whole.json() == {"session": f"shared/{SPACE}/agent/{GHOST}/session/ro",
                            "truncated_bytes": 0, "tightened": [], "left": []}  # fmt: skip
    with events.open("ab") as log:
        log.write(TORN)
    before = (events.read_bytes(), modes(events))
    message = refused(as_member(root, gid, *argv), "EACCES")
    assert message == (
        f"{events} ends with a torn line of {len(TORN)} bytes, which cannot be cut by a caller "
        "who may not write it; nothing was changed: repair it as its owner or as root"
    )
    assert (events.read_bytes(), modes(events)) == before
    mended = ctx(root, *argv)
    assert mended.rc == 0 and mended.json()["truncated_bytes"] == len(TORN), mended
    assert events.read_bytes() == EVENT


# --------------------------------------------------------- repair by a root of fewer capabilities


def without(storage: Path, capability: str, *args: str) -> Run:
    """``ctx ARGS`` as uid 0 whose bounding set (so, after the exec, whose every set) lacks
    ``capability``."""
    argv = ["setpriv", "--bounding-set", f"-{capability}", "--inh-caps", "-all",
            "--ambient-caps", "-all", *CTX_ARGV, *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, env=env_of(storage), timeout=60,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    return as_run(done, args)


@pytest.fixture
def setpriv() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv(1) to run ctx as a root of fewer capabilities")
    probe = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-fowner", "true"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot narrow the bounding set here: {probe.stderr.strip()}")


@pytest.mark.usefixtures("setpriv")
def test_repair_by_a_root_without_cap_dac_override_names_that_capability(root: Path) -> None:
    """docs/sessions.md "Reading, torn lines and repair": a torn line a caller may read but
    not cut is refused (EACCES, exit 1), naming the file and the torn bytes, nothing
    changed.  A root whose capability set lacks CAP_DAC_OVERRIDE (a container's) may read the
    agent's 0600 file but not write it: the refusal says which capability it lacks and what
    to do, rather than advising 'root', which it is."""
    directory = home_session(root, "cap", EVENT + TORN)
    events = directory / "events.jsonl"
    before = (events.read_bytes(), modes(directory, events))
    argv = ("session", "repair", GHOST, "cap", "--uid", str(GHOST_UID), "--json")
    message = refused(without(root, "dac_override", *argv), "EACCES")
    assert message.startswith(
        f"{events} ends with a torn line of {len(TORN)} bytes, which cannot be cut by a caller "
        "who may not write it; nothing was changed: "
    ), message
    assert "lacks CAP_DAC_OVERRIDE" in message and "run as a root that holds it" in message
    assert (events.read_bytes(), modes(directory, events)) == before
    mended = ctx(root, *argv)
    assert mended.rc == 0 and mended.json()["truncated_bytes"] == len(TORN), mended


@pytest.mark.usefixtures("setpriv")
def test_repair_by_a_root_without_cap_fowner_leaves_an_older_session_as_it_was(
    root: Path,
) -> None:
    """docs/sessions.md "Sessions made by older versions": ``ctx session repair`` tightens
    an older home session (0750, events.jsonl 0640) before it cuts; the agent's directory is
    changed only by root, and a root lacking CAP_FOWNER cannot: EPERM naming the directory,
    its mode and the capability, "nothing was done" — the torn line, every mode and owner as
    they were.  A full root then tightens both and cuts."""
    directory = home_session(root, "old", EVENT + TORN, dir_mode=0o750, file_mode=0o640)
    events = directory / "events.jsonl"
    before = (events.read_bytes(), modes(directory, events))
    argv = ("session", "repair", GHOST, "old", "--uid", str(GHOST_UID), "--json")
    message = refused(without(root, "fowner", *argv), "EPERM")
    assert message.startswith(
        f"making {directory} (uid {GHOST_UID}'s, mode 0750) 0700 needs CAP_FOWNER"
    ), message
    assert "nothing was done" in message, message
    assert (events.read_bytes(), modes(directory, events)) == before
    mended = ctx(root, *argv)
    assert mended.rc == 0, mended
    assert mended.json()["tightened"] == [
        f"{directory} (mode 0750 -> 0700)",
        f"{events} (mode 0640 -> 0600)",
    ], mended
    assert (events.read_bytes(), [m for m, _, _ in modes(directory, events)]) == (
        EVENT,
        [0o700, 0o600],
    )


def test_repair_of_an_older_session_whose_events_file_is_hard_linked_warns_and_refuses(
    root: Path, scratch: Path
) -> None:
    """docs/sessions.md "Appending, crash-safely" and the help of ``ctx session repair``: in
    an older home session, an ``events.jsonl`` with two names is not tightened but named in a
    ``ctx: warning:`` line, and not repaired (EINVAL "is a file with 2 names (hard links);
    refusing to repair it"), the refusal ending with what was tightened before; the other
    name keeps its bytes and mode."""
    directory = home_session(root, "linked", EVENT + TORN, dir_mode=0o750, file_mode=0o640)
    events = directory / "events.jsonl"
    other = scratch / "other-name"
    os.link(events, other)
    r = ctx(root, "session", "repair", GHOST, "linked", "--uid", str(GHOST_UID), "--json")
    message = refused(r, "EINVAL")
    assert message == (
        f"{events} is a file with 2 names (hard links); refusing to repair it (before that, "
        f"it tightened {directory} (mode 0750 -> 0700))"
    ), r
    warning = r.err.splitlines()[0]
    assert warning.startswith(
        f"ctx: warning: {events} has mode 0640 but is left as it is, not made 0600: it is a "
        "file with 2 names (hard links)"
    ), r
    assert other.read_bytes() == EVENT + TORN
    assert modes(other) == [(0o640, GHOST_UID, GHOST_UID)]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_the_agents_own_home_closed_to_a_member_is_eacces_naming_it(root: Path) -> None:
    """ctx.session "ctx session": exit 1 with EACCES when a directory on the way is closed to
    the caller, naming its whole path and who may read it.  A member asks for the sessions of
    a gone agent in another uid's home: with ``--uid`` the home's private ``agent/`` (0700) is
    named with its owner, group and mode; without it the member is told that no home it may
    search holds them (ENOENT), and nothing changes."""
    gid = group_of_test_user()
    home_session(root, "s1", EVENT, uid=GHOST_UID, gid=gid)
    closed = root / "home" / str(GHOST_UID) / "agent"
    before = snapshot(root / "home")
    named = as_member(root, gid, "session", "show", GHOST, "s1", "--uid", str(GHOST_UID),
                      "--json")  # fmt: skip
    message = refused(named, "EACCES")
    assert f"may not read {closed} (owner uid {GHOST_UID}, group {gid}, mode 0700)" in message
    unnamed = as_member(root, gid, "session", "show", GHOST, "s1", "--json")
    assert "no home holds sessions of it" in refused(unnamed, "ENOENT"), unnamed
    assert snapshot(root / "home") == before


# ------------------------------------------------------------- repair to a full standard output


def test_repair_to_a_full_standard_output_says_what_it_cut(root: Path) -> None:
    """README, docs/queue.md: a standard output that refuses what is written (``> /dev/full``)
    ends a command with ``ctx: ENOSPC: cannot write standard output (…)`` and exit 74, saying
    on the same line what it had done: here the cut of a torn line, which is made."""
    directory = home_session(root, "full", EVENT + TORN)
    events = directory / "events.jsonl"
    r = to_full(root, "session", "repair", GHOST, "full", "--uid", str(GHOST_UID))
    assert "Traceback" not in r.err and r.rc == 74, r
    assert r.err.splitlines()[-1] == (
        "ctx: ENOSPC: cannot write standard output (No space left on device); a torn last "
        f"line of {len(TORN)} bytes was truncated from {events}"
    ), r
    assert events.read_bytes() == EVENT


def test_repair_that_tightens_to_a_full_standard_output_says_so_and_cuts(root: Path) -> None:
    """The same full standard output, for a repair that first tightens an older session
    (its text output lists what it tightened): exit 74, the standard output named, no
    ``None`` in the sentence, the torn line cut and the modes tightened, as said."""
    directory = home_session(root, "fullold", EVENT + TORN, dir_mode=0o750, file_mode=0o640)
    events = directory / "events.jsonl"
    r = to_full(root, "session", "repair", GHOST, "fullold", "--uid", str(GHOST_UID))
    assert "Traceback" not in r.err, r
    last = r.err.splitlines()[-1]
    assert "None" not in last, r
    assert last.startswith("ctx: ENOSPC: cannot write standard output"), r
    assert r.rc == 74, r
    assert events.read_bytes() == EVENT
    assert [m for m, _, _ in modes(directory, events)] == [0o700, 0o600]


# --------------------------------------------------------------------- appends by ctx run


@dataclass
class Host(OnStorage):
    """A storage root with tool ``demo.echo`` (prints its input back) and agent ``coder`` (the
    test user) allowed to run it; each test records in sessions of its own."""

    storage: Path
    user: UnprivilegedUser

    @property
    def env(self) -> dict[str, str]:
        return env_of(self.storage)

    def events_path(self, session: str) -> Path:
        home = self.storage / "home" / str(self.user.uid)
        return home / "agent" / AGENT / "session" / session / "events.jsonl"

    @property
    def log(self) -> Path:
        return self.storage / "tool" / "demo.echo.d" / "log"

    def argv(self, session: str) -> list[str]:
        return ["run", "--agent", AGENT, "--native", "--session", session, "demo.echo"]

    def native(self, session: str, payload: str) -> tuple[Run, dict]:
        """One native call of ``demo.echo``; the run and its last frame (the result)."""
        r = self.ctx(*self.argv(session), input=payload)
        frames = [json.loads(line) for line in r.out.splitlines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def recorded(self, session: str, call: str) -> tuple[dict, dict, dict]:
        """The call's ``tool_call`` and ``tool_result`` in the session, each once, and its one
        line of the tool's log."""
        mine = [e for e in lines_of(self.events_path(session)) if e.get("call") == call]
        assert [e["type"] for e in mine] == ["tool_call", "tool_result"], mine
        logged = [e for e in lines_of(self.log) if e.get("call") == call]
        assert len(logged) == 1, logged
        return mine[0], mine[1], logged[0]


def lines_of(path: Path) -> list[dict]:
    """The events of a log, each line strict UTF-8 holding one JSON object."""
    return [json.loads(raw.decode("utf-8")) for raw in path.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def host(_template: Path) -> Iterator[Host]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "h")
    try:
        made = Host(copy_of_root(_template, top / "storage"), user)
        manifest = tool_manifest(top / "src", "demo.echo", ECHO)
        installed = made.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        made.allow_tool(LABEL, "demo.echo")
        made.create_agent(
            {"name": AGENT, "label": LABEL, "tools": ["demo.echo"], "mount": []},
            "--user", user.name,
        )  # fmt: skip
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


LOCK_HOLDER = """
import fcntl, os, sys, time
fds = [os.open(path, os.O_RDONLY) for path in sys.argv[1:]]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_locks_kept_past_ten_seconds_fail_an_append_but_not_a_space_creation(
    host: Host,
) -> None:
    """docs/sessions.md "Appending, crash-safely": an append waits at most ten seconds for a
    log another process keeps locked, then fails with EAGAIN naming the file, "instead of
    holding a tool call … forever": ``ctx run`` answers at stage ``session``, before the tool
    runs, and appends nothing.  "Shared spaces": a ``ctx shared create`` that finds
    ``shared/`` locked for 10 seconds goes on without the lock and makes the space.  Once
    the holder is gone, the same call is recorded."""
    first, frame = host.native("locked", '{"n": 1}')
    assert first.rc == 0 and frame["status"] == "ok", first
    events = host.events_path("locked")
    shared = host.storage / "shared"
    before = (events.read_bytes(), host.log.read_bytes())
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(events), str(shared)],
                              stdout=subprocess.PIPE)  # fmt: skip
    call: subprocess.Popen | None = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        started = time.monotonic()
        call = subprocess.Popen(
            [*CTX_ARGV, *host.argv("locked")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=host.env,
        )  # fmt: skip
        assert call.stdin is not None
        call.stdin.write(b'{"n": 2}')
        call.stdin.close()  # the call reads its input whole, then opens its session
        creation = ctx(host.storage, "shared", "create", "late", "--json", timeout=60)
        call.stdin = None  # closed above: nothing more to send
        out, err = call.communicate(timeout=60)
        waited = time.monotonic() - started
        assert (events.read_bytes(), host.log.read_bytes()) == before
    finally:
        for process in (holder, call):
            if process is not None and process.poll() is None:
                process.kill()
            if process is not None:
                process.wait()
    assert call is not None
    assert 9 <= waited < 40, waited
    assert creation.rc == 0 and str(shared / "late") in creation.json()["created"], creation
    assert (shared / "late" / "agent").is_dir()
    result = json.loads(out.decode().splitlines()[-1])
    assert "Traceback" not in err.decode() and call.returncode == 1, (out, err)
    error = result["error"]
    assert (error["error"], error["stage"]) == ("EAGAIN", "session"), result
    assert error["message"].startswith(f"{events} stayed locked by another process for 10 s"), (
        result
    )
    assert "find it with 'fuser' and end it" in error["message"], result
    assert (result["exit_status"], result["output"]) == (None, None), result
    again, frame = host.native("locked", '{"n": 3}')
    assert again.rc == 0 and frame["status"] == "ok", again
    host.recorded("locked", frame["call"])


def test_an_immutable_events_file_refuses_the_call_before_the_tool_runs(host: Host) -> None:
    """docs/sessions.md "Events": a call whose session cannot be opened is refused at stage
    ``session`` before its tool runs (docs/tools.md); an ``events.jsonl`` made immutable
    (``chattr +i``), which refuses root too, gives EPERM naming the file and saying the tool
    did not run; the session and the tool's log are byte for byte as they were."""
    first, frame = host.native("pinned", '{"n": 1}')
    assert first.rc == 0 and frame["status"] == "ok", first
    events = host.events_path("pinned")
    before = (events.read_bytes(), host.log.read_bytes())
    with attribute(events, "i"):
        r, result = host.native("pinned", '{"n": 2}')
        assert (events.read_bytes(), host.log.read_bytes()) == before
    assert "Traceback" not in r.err and r.rc == 1, r
    error = result["error"]
    assert (error["error"], error["errno"], error["stage"]) == ("EPERM", 1, "session"), r
    assert str(events) in error["message"] and "the tool did not run" in error["message"], r
    assert (result["exit_status"], result["output"]) == (None, None), r


# ------------------------------------------------------------------ redaction of odd secrets


def test_values_of_every_json_type_under_a_secret_are_redacted(host: Host) -> None:
    """docs/sessions.md "What logs may say (S-4)": the value under a key naming a secret
    becomes "[redacted]" whatever its type (null, a boolean, a number, an empty string, list
    or object), and so does a name/value pair's value of any type, a two-word list's second
    word and an ``Authorization`` given as a list; the caller's result keeps the data whole."""
    payload = {
        "token": None, "password": True, "secret": 0, "apiKey": [], "cookie": {},
        "passwd": "", "credential": 987654.321, "authorization": ["Bearer", "lst-s3cr3t-1"],
        "env": [{"name": "API_TOKEN", "value": {"nested": "obj-s3cr3t-2"}}],
        "pair": ["db_password", 55443322], "note": "kept",
    }  # fmt: skip
    r, result = host.native("types", json.dumps(payload))
    assert r.rc == 0 and result["output"] == payload, r
    call, done, logged = host.recorded("types", result["call"])
    expected = {
        "token": R, "password": R, "secret": R, "apiKey": R, "cookie": R, "passwd": R,
        "credential": R, "authorization": R, "env": [{"name": "API_TOKEN", "value": R}],
        "pair": ["db_password", R], "note": "kept",
    }  # fmt: skip
    assert call["input"] == expected and done["output"] == expected, (call, done)
    assert logged["input"] == expected and logged["output"] == expected, logged
    records = host.events_path("types").read_bytes() + host.log.read_bytes()
    for secret in (b"lst-s3cr3t-1", b"obj-s3cr3t-2", b"55443322", b"987654.321"):
        assert secret not in records, secret


def test_secret_keys_spelt_oddly_or_cut_still_lose_their_values(host: Host) -> None:
    """docs/sessions.md "What logs may say (S-4)": a key names a secret when, with all but
    letters and digits dropped, it contains a secret word — so a zero-width space inside it,
    a space (``DB PASSWORD``) or a byte that is not UTF-8 changes nothing — and keys are
    summarised like any text: one of 260 characters ending in ``_password`` is cut to its
    first 200 with the count of those dropped, and its value is still redacted."""
    long_key = "x" + "a" * 250 + "_password"
    text = (
        '{"pass\\u200bword": "zw-s3cr3t-1", "DB PASSWORD": "sp-s3cr3t-2", '
        f'"{long_key}": "long-s3cr3t-3", "pass\\udcffword": "sur-s3cr3t-4"}}'
    )
    r, result = host.native("keys", text)
    assert r.rc == 0, r
    call, done, logged = host.recorded("keys", result["call"])
    cut = f"{long_key[:200]}\u2026[+{len(long_key) - 200} chars]"
    expected = {"pass\u200bword": R, "DB PASSWORD": R, cut: R, "pass\udcffword": R}
    for summary in (call["input"], done["output"], logged["input"], logged["output"]):
        assert summary == expected, summary
    shown = ctx(host.storage, "session", "show", AGENT, "keys", "--json")
    assert shown.rc == 0, shown
    records = host.events_path("keys").read_bytes() + host.log.read_bytes()
    for secret in ("zw-s3cr3t-1", "sp-s3cr3t-2", "long-s3cr3t-3", "sur-s3cr3t-4"):
        assert secret.encode() not in records and secret not in shown.out, secret


# ----------------------------------------------------------- ctx shared create: what it meets


def plant_fifo_config(queue: Path, outside: Path) -> None:
    os.mkfifo(queue / "config")


def plant_linked_state(queue: Path, outside: Path) -> None:
    (queue / "pending").symlink_to(outside)


def plant_bad_config(queue: Path, outside: Path) -> None:
    (queue / "config").write_bytes(b"max_request_bytes=abc\n")


QUEUE_OBSTACLES = {
    "fifo-config": (
        plant_fifo_config,
        "EINVAL",
        "{q}/config is a FIFO, not a regular file; move it aside, and 'ctx queue init' "
        "writes the default config in its place",
    ),
    "linked-state": (
        plant_linked_state,
        "ELOOP",
        "{q}/pending is a symlink, not a real directory; refusing to follow it",
    ),
    "bad-config": (
        plant_bad_config,
        "EINVAL",
        "{q}/config:1: max_request_bytes must be a positive integer, not 'abc'",
    ),
}


@pytest.mark.parametrize("case", sorted(QUEUE_OBSTACLES))
def test_completing_a_space_whose_queue_every_command_refuses_makes_nothing(
    storage: Path, scratch: Path, case: str
) -> None:
    """``ctx shared create --help``: the command completes a space where parts are missing,
    such as one whose queue came first; a queue that every queue command would refuse (its
    config a FIFO, never opened to hang on; a state directory that is a link, never
    followed; a config that does not parse) is refused with its path, exit 1, before
    anything is made: no ``tool/``, ``data/`` or ``agent/``, the link's target untouched."""
    plant, name, expected = QUEUE_OBSTACLES[case]
    queue = storage / "shared" / "half" / "queue"
    queue.mkdir(parents=True)
    outside = scratch / "outside"
    outside.mkdir()
    (outside / "keep.req.json").write_bytes(b"{}")
    plant(queue, outside)
    before = (snapshot(storage / "shared"), snapshot(outside))
    r = ctx(storage, "shared", "create", "half", "--json", timeout=30)
    assert refused(r, name) == expected.format(q=queue), r
    assert (snapshot(storage / "shared"), snapshot(outside)) == before


def test_a_space_name_that_is_a_link_is_in_the_way_and_never_followed(
    storage: Path, scratch: Path
) -> None:
    """docs/sessions.md "Shared spaces": each directory is reached without following a link;
    a link planted at ``shared/<name>`` is ENOTDIR "is in the way … move it aside, nothing
    was changed", exit 1: the directory it names gets no space inside."""
    outside = scratch / "elsewhere"
    outside.mkdir()
    link = storage / "shared" / "lnk"
    link.symlink_to(outside)
    r = ctx(storage, "shared", "create", "lnk", "--json")
    message = refused(r, "ENOTDIR")
    assert message == (
        f"{link} is in the way: it should be a directory of the shared space; move it aside, "
        "nothing was changed"
    ), r
    assert os.listdir(outside) == [] and os.readlink(link) == str(outside)


@pytest.mark.parametrize("name", [".hidden", "x.d", "cortexfs-docs"])
def test_an_illegal_or_reserved_name_already_present_is_a_usage_error_left_as_it_is(
    storage: Path, name: str
) -> None:
    """docs/sessions.md "Shared spaces": a NAME that is not an object name (R-3), or the
    manual bundle ``cortexfs-docs`` (X-2), is a usage error, EINVAL, exit 2, nothing made —
    also when a directory of that name is already there: it is neither completed nor
    regrouped."""
    there = storage / "shared" / name
    there.mkdir(exist_ok=True)
    (there / "mine.txt").write_bytes(b"kept\n")
    before = (snapshot(storage / "shared"), modes(there))
    r = ctx(storage, "shared", "create", name, "--group", "4343", "--json")
    message = refused(r, "EINVAL", 2)
    assert name in message, r
    assert (snapshot(storage / "shared"), modes(there)) == before


def test_a_user_who_may_write_shared_but_not_read_it_makes_no_space(searchable_storage: Path):
    """docs/sessions.md "Shared spaces": the space is reached without following links; a
    ``shared/`` an administrator narrowed to 0733 (others may write and search, not read) is
    refused to a user before anything is made: EACCES, exit 1, naming ``shared/``, its
    owner, group and mode."""
    shared = searchable_storage / "shared"
    shared.chmod(0o733)
    try:
        before = snapshot(shared)
        r = as_member(searchable_storage, MEMBER_UID, "shared", "create", "mine", "--json")
        message = refused(r, "EACCES")
        assert f"may not read {shared} (owner uid 0, group 0, mode 0733)" in message, r
        assert snapshot(shared) == before
    finally:
        shared.chmod(0o755)


def tree_groups(top: Path) -> dict[str, int]:
    """The group of ``top`` and of every entry below it, links not followed."""
    found = {".": os.lstat(top).st_gid}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            found[str(path.relative_to(top))] = os.lstat(path).st_gid
    return found


def test_a_regroup_keeps_what_lies_deeper_than_it_walks_and_regroups_special_files(
    storage: Path,
) -> None:
    """``ctx shared create --help``: ``--group G`` for a space of another group gives G every
    entry that had the old group, "as does what lies more than 256 directories deep, each
    listed as kept"; a FIFO (never opened to block on) and a device node (never opened as
    the device) are entries like any other.  The count said is the count changed."""
    assert ctx(storage, "shared", "create", "deep").rc == 0
    space = storage / "shared" / "deep"
    levels = [space / "data"]
    for _ in range(260):
        levels.append(levels[-1] / "d")
    levels[-1].mkdir(parents=True)
    (levels[-1] / "leaf").write_bytes(b"deep\n")
    os.mkfifo(space / "data" / "fifo")
    os.mknod(space / "data" / "null", 0o660 | stat.S_IFCHR, os.makedev(1, 3))
    old = os.lstat(space).st_gid
    before = tree_groups(space)
    r = ctx(storage, "shared", "create", "deep", "--group", "4343", "--json", timeout=60)
    assert r.rc == 0 and "Traceback" not in r.err, r
    report = r.json()
    kept_dir = levels[255]  # data/ and 255 levels below it: 256 directories below the space
    assert report["kept"] == [
        {
            "path": str(kept_dir),
            "reason": "deeper than 256 directories: what it holds was not walked",
        }
    ], report["kept"]
    after = tree_groups(space)
    still_old = {p for p, g in after.items() if g == old}
    inside_kept = str(kept_dir.relative_to(space)) + "/"
    assert still_old and all(p.startswith(inside_kept) for p in still_old), still_old
    assert report["regrouped_from"] == old and report["gid"] == 4343, report
    assert report["regrouped"] == sum(g == old for g in before.values()) - len(still_old)
    for special, kind in (("fifo", stat.S_ISFIFO), ("null", stat.S_ISCHR)):
        status = os.lstat(space / "data" / special)
        assert kind(status.st_mode) and status.st_gid == 4343, special
    assert os.lstat(space / "data" / "null").st_rdev == os.makedev(1, 3)


def test_a_member_completing_a_space_cannot_then_move_another_agents_sessions(
    searchable_storage: Path,
) -> None:
    """docs/sessions.md "Shared spaces": the space, ``agent/`` and ``queue/`` are sticky
    (03770): "a member adds entries there but never renames or removes another's — … another
    agent's sessions"; the command "completes a space … a run cut short … left incomplete".
    A space made by root lacks its ``agent/``; a member of its group completes it (or is
    refused and root does); an agent then records a session there: the member may not
    rename it away."""
    gid = group_of_test_user()
    storage = searchable_storage
    assert ctx(storage, "shared", "create", SPACE, "--group", str(gid)).rc == 0
    space = storage / "shared" / SPACE
    (space / "agent").rmdir()
    as_member(storage, gid, "shared", "create", SPACE, "--json")
    if not (space / "agent").is_dir():
        assert ctx(storage, "shared", "create", SPACE).rc == 0
    space_session(storage, "s1", EVENT, gid)
    script = "import os, sys; os.rename(sys.argv[1], sys.argv[2])"
    moved = subprocess.run(
        [SYSTEM_PYTHON, "-c", script, str(space / "agent" / GHOST), str(space / "agent" / "x")],
        capture_output=True, text=True, cwd="/", user=MEMBER_UID, group=gid, extra_groups=[gid],
    )  # fmt: skip
    assert moved.returncode != 0 and "PermissionError" in moved.stderr, moved
    assert (space / "agent" / GHOST / "session" / "s1" / "events.jsonl").read_bytes() == EVENT
