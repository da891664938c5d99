"""``ctx session list|show|tail|repair`` across homes of several uids and several shared spaces
(SPEC S-1, S-2, S-5, S-6, R-3, X-1; docs/sessions.md, "Commands").

One storage root holds two spaces, ``sp1`` and ``sp2``, of group ``ctxsle-g``, and agents of
the real uids ``ctxsle-a`` and ``ctxsle-b`` (members of the group); ``ctxsle-o`` is a real uid
outside it.  The flows: hundreds of sessions of one agent, listed in name order in text and
``--json``; the same session names in a home and in two spaces; an agent deleted while its
sessions stay in one home, then in two; an agent that never existed; ``--uid`` and ``tail -n``
at and past their bounds; names at the R-3 limits; session directories that are damaged
(no ``events.jsonl``, a file, a link, another uid's, unreadable) or whose ``session/`` itself
is; what a non-root owner, a member and an outsider see; and listings taken while sessions
are being made, written and removed.  Everything runs through the ``ctx`` command, with real
processes and real uids; sessions made by hand are made as the agent's uid would make them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    is_object_name,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, members_of, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as several real uids")

GROUP = "ctxsle-g"
SPACES = ("sp1", "sp2")
ECHO = "#!/bin/sh\ncat\n"
TS = "2026-06-22T12:00:00Z"
LONGEST = "L" * 63 + "9"  # 64 bytes, the longest object name
TOO_LONG = "L" * 65
# agent -> which of the two users it runs as
AGENTS = {"alpha": "a", "beta": "b", "many": "a", "churn": "a", "wreck": "a", LONGEST: "b"}

# Writes one S-2 event per session name given, each in a directory of its own, as the
# agent's uid does (0700 directories, 0600 files): $1 the session/ directory, $2 the agent.
MAKE_SESSIONS = r"""
umask 077
cd "$1" || exit 1
agent=$2
shift 2
shape='{"ts":"%s","type":"note","agent":"%s","session":"%s","object":"test/list",'
for name; do
    mkdir -- "$name" || exit 1
    printf "$shape"'"status":"ok"}\n' 2026-06-22T12:00:00Z "$agent" "$name" \
        > "$name/events.jsonl" || exit 1
done
"""


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    a: UnprivilegedUser
    b: UnprivilegedUser
    outsider: UnprivilegedUser
    gid: int

    def user_of(self, agent: str) -> UnprivilegedUser:
        return self.a if AGENTS.get(agent, "a") == "a" else self.b

    def session(self, *args: str, **kw) -> Run:
        return self.ctx("session", *args, **kw)

    def record(self, agent: str, session: str, *options: str, n: int = 1) -> Run:
        """One native call of ``demo.echo`` by ``agent`` in ``session``: two events."""
        r = self.ctx("run", "--agent", agent, *options, "--session", session, "--native",
                     "demo.echo", input=json.dumps({"n": n}))  # fmt: skip
        assert r.rc == 0, r
        return r

    def home_sessions(self, agent: str, user: UnprivilegedUser | None = None) -> Path:
        uid = (user or self.user_of(agent)).uid
        return self.storage / "home" / str(uid) / "agent" / agent / "session"

    def shared_sessions(self, space: str, agent: str) -> Path:
        return self.storage / "shared" / space / "agent" / agent / "session"

    def as_user(self, user: UnprivilegedUser, argv: list[str], **kw) -> Run:
        """``argv`` as ``user`` with its groups (the space's for a member), aimed at the
        storage root, with a home nobody has."""
        groups = [] if user == self.outsider else [self.gid]
        env = {**self.env, "HOME": "/nonexistent"}
        done = subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=groups, env=env,
                              capture_output=True, text=True, timeout=60, **kw)  # fmt: skip
        shown = argv[len(CTX_ARGV) :] if argv[: len(CTX_ARGV)] == CTX_ARGV else argv
        return Run(shown, done.returncode, done.stdout, done.stderr)

    def session_as(self, user: UnprivilegedUser, *args: str) -> Run:
        return self.as_user(user, [*CTX_ARGV, "session", *args])

    def make_by_hand(self, agent: str, names: list[str], parent: Path | None = None) -> Path:
        """Sessions ``names`` of ``agent``, one event each, made by the agent's uid in
        ``parent`` (default: its home's session/ directory, which must exist)."""
        parent = parent or self.home_sessions(agent)
        r = self.as_user(self.user_of(agent), ["/bin/sh", "-c", MAKE_SESSIONS, "sh",
                                               str(parent), agent, *names])  # fmt: skip
        assert r.rc == 0, r
        return parent

    def create_named(self, agent: str, user: UnprivilegedUser) -> None:
        request = {"name": agent, "label": "sle_t", "mount": [], "tools": ["demo.echo"],
                   "shared": {space: ["read", "write"] for space in SPACES}}  # fmt: skip
        self.create_agent(request, "--user", user.name, "--groups", str(self.gid))

    def delete_agent(self, agent: str) -> None:
        """The host removes the agent (its entry and its controls); its sessions stay."""
        (self.storage / "agent" / agent).unlink()
        shutil.rmtree(self.storage / "agent" / f"{agent}.d")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    (a, b), gid = members_of(GROUP, "ctxsle-a", "ctxsle-b")
    (outsider,) = users_named("ctxsle-o")
    top = new_scratch_dir(scratch_top(__file__))
    try:
        storage = top / "storage"
        w = World(storage, top, a, b, outsider, gid)
        assert w.ctx("bootstrap", "--storage", storage).rc == 0
        for space in SPACES:
            r = w.ctx("shared", "create", space, "--group", GROUP)
            assert r.rc == 0, r
        manifest = tool_manifest(top / "m", "demo.echo", ECHO)
        r = w.ctx("object", "install", manifest, "--tier", "system")
        assert r.rc == 0, r
        w.allow_tool("sle_t", "demo.echo")
        for agent in AGENTS:
            w.create_named(agent, w.user_of(agent))
        w.record("alpha", "default")  # makes home/<uid a>/ as the runner does
        w.record("beta", "default")
        for agent in ("many", "churn", "wreck", LONGEST):
            # session/ made by the agent's uid in its home, then a first session
            user = w.user_of(agent)
            made = w.as_user(user, ["mkdir", "-p", "-m", "0700", str(w.home_sessions(agent))])
            assert made.rc == 0, made
            w.make_by_hand(agent, ["default"])
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------ helpers


def failed(r: Run, rc: int, code: str, *words: str) -> None:
    """Exit ``rc``, ``ctx: CODE:`` on stderr with each of ``words``, no traceback; with
    ``--json``, the same error as one JSON object, the last line on stdout."""
    assert r.rc == rc, r
    assert f"ctx: {code}:" in r.err and "Traceback" not in r.err + r.out, r
    for word in words:
        assert word in r.err, (word, r)
    if "--json" in r.argv:
        error = json.loads(r.lines()[-1])
        assert error["error"] == code, r
        assert all(word in error["message"] for word in words), r


def listed(r: Run) -> list[str]:
    assert r.rc == 0 and "Traceback" not in r.err, r
    return r.lines()


def listed_json(r: Run) -> list[dict]:
    assert r.rc == 0 and "Traceback" not in r.err, r
    document = json.loads(r.out)
    assert isinstance(document, list), r
    for entry in document:
        assert set(entry) == {"name", "path"}, r
    return document


def json_lines(r: Run) -> list[dict]:
    assert r.rc == 0 and "Traceback" not in r.err, r
    return [json.loads(text) for text in r.out.split("\n") if text]


@contextlib.contextmanager
def mode_for_a_while(path: Path, mode: int) -> Iterator[None]:
    kept = stat.S_IMODE(path.lstat().st_mode)
    path.chmod(mode)
    try:
        yield
    finally:
        path.chmod(kept)


# ------------------------------------------------------------------ many sessions


def hundreds_of_names() -> list[str]:
    names = [f"s{i:03d}" for i in range(300)]
    names += ["0", "9z", "A", "Z", "ZZ", "a", "a.", "a..b", "a-", "a_", "B.D", "x.dd",
              LONGEST, "L" * 64, "default2"]  # fmt: skip
    assert all(is_object_name(name) for name in names)
    return names


def test_hundreds_of_sessions_are_listed_in_name_order_by_root_and_by_the_owner(world):
    """S-1, R-3, docs/sessions.md (``list`` prints one session name a line; ``--json`` one
    array of ``{"name", "path"}``): agent ``many`` holds 316 sessions, among them names of 1
    and 64 bytes, capitals, dots and dashes, plus directories whose names R-3 refuses (65
    bytes, ``.d``, a leading dot or dash).  Root and the owner (non-root) list the same legal
    names, each once, in byte order; each ``path`` is the session's directory; the two
    sessions of 64-byte names are shown and tailed by name."""
    names = hundreds_of_names()
    parent = world.make_by_hand("many", names)
    world.make_by_hand("many", [TOO_LONG, "y.d", ".hidden", "-dash"], parent)
    expected = sorted([*names, "default"])

    text = world.session("list", "many")
    assert listed(text) == expected, text
    document = listed_json(world.session("list", "many", "--json"))
    assert [entry["name"] for entry in document] == expected
    assert [entry["path"] for entry in document] == [str(parent / name) for name in expected]
    assert all(Path(entry["path"], "events.jsonl").is_file() for entry in document)

    as_owner = world.session_as(world.a, "list", "many")
    assert listed(as_owner) == expected, as_owner
    as_owner_json = world.session_as(world.a, "list", "many", "--json")
    assert listed_json(as_owner_json) == document

    shown = json_lines(world.session("show", "many", "L" * 64, "--json"))
    assert [(e["session"], e["type"]) for e in shown] == [("L" * 64, "note")]
    tailed = json_lines(world.session("tail", "many", "--session", LONGEST, "-n", "5", "--json"))
    assert [e["session"] for e in tailed] == [LONGEST]


# ------------------------------------------------------------------ homes and spaces


def test_each_home_and_each_space_lists_only_its_own_sessions(world):
    """S-1, X-1: ``alpha`` (uid a) and ``beta`` (uid b) each record a session named ``same``
    in their home and in both spaces.  Every place lists exactly its agent's sessions there
    (what its ``session/`` directory holds), ``--json`` paths point into that place, and
    ``show`` of ``same`` in each place prints that place's call only."""
    calls: dict[tuple[str, str], set[str]] = {}
    for agent in ("alpha", "beta"):
        for where in ("home", *SPACES):
            options = () if where == "home" else ("--project", where)
            r = world.record(agent, "same", *options, n=len(calls))
            calls[agent, where] = {line["call"] for line in map(json.loads, r.lines())
                                   if "call" in line}  # fmt: skip
    assert len(set().union(*calls.values())) == 6
    for agent in ("alpha", "beta"):
        for where in ("home", *SPACES):
            options = () if where == "home" else ("--project", where)
            parent = (world.home_sessions(agent) if where == "home"
                      else world.shared_sessions(where, agent))  # fmt: skip
            document = listed_json(world.session("list", agent, *options, "--json"))
            names = [entry["name"] for entry in document]
            assert "same" in names and names == sorted(os.listdir(parent)), (agent, where)
            assert [entry["path"] for entry in document] == [str(parent / n) for n in names]
            if agent == "beta" and where != "sp2":
                continue  # its calls elsewhere: one place is enough
            events = json_lines(world.session("show", agent, "same", *options, "--json"))
            assert {e["agent"] for e in events} == {agent}, events
            assert {e["session"] for e in events} == {"same"}, events
            assert {e["call"] for e in events} == calls[agent, where], (agent, where)


def test_a_deleted_agents_sessions_are_read_from_its_one_home_then_uid_is_asked(world):
    """S-1, docs/sessions.md (sessions outlive their agent; the caller's own home first, else
    the only one; several: ``--uid`` says which, EINVAL, exit 2): ``nomad`` runs as uid a,
    records ``first`` in its home and in ``sp1``, and is deleted: root lists, shows, tails
    and repairs ``first`` from that home, and the space still lists its session.  Made again
    as uid b, it records ``second`` and is deleted again: each command without ``--uid`` is
    a usage error naming both uids; ``--uid`` picks a home; uid b and uid a each get their
    own home without ``--uid``; the outsider, who may read neither, gets ENOENT."""
    world.create_named("nomad", world.a)
    world.record("nomad", "first")
    world.record("nomad", "first", "--project", "sp1")
    world.delete_agent("nomad")
    assert listed(world.session("list", "nomad")) == ["first"]
    assert [e["session"] for e in json_lines(world.session("show", "nomad", "first", "--json"))]
    assert len(json_lines(world.session("tail", "nomad", "first", "-n", "1", "--json"))) == 1
    repaired = world.session("repair", "nomad", "first", "--json")
    assert repaired.rc == 0 and repaired.json() == {
        "session": f"home/{world.a.uid}/agent/nomad/session/first",
        "truncated_bytes": 0, "tightened": [], "left": []}, repaired  # fmt: skip
    assert listed(world.session("list", "nomad", "--project", "sp1")) == ["first"]
    missing = world.session("show", "nomad", "nope")
    failed(missing, 1, "ENOENT", "ctx session list nomad")

    world.create_named("nomad", world.b)
    world.record("nomad", "second")
    world.delete_agent("nomad")
    both = f"{world.b.uid}, {world.a.uid}" if world.b.uid < world.a.uid else (
        f"{world.a.uid}, {world.b.uid}")  # fmt: skip
    for args in (("show", "nomad", "first"), ("repair", "nomad", "first", "--json"),
                 ("list", "nomad", "--json")):  # fmt: skip
        r = world.session(*args)
        failed(r, 2, "EINVAL", both, "--uid")
    assert listed(world.session("list", "nomad", "--uid", str(world.a.uid))) == ["first"]
    assert listed(world.session("list", "nomad", "--uid", str(world.b.uid))) == ["second"]
    assert listed(world.session_as(world.a, "list", "nomad")) == ["first"]
    assert listed(world.session_as(world.b, "list", "nomad")) == ["second"]
    shown = world.session_as(world.b, "show", "nomad", "second", "--json")
    assert {e["session"] for e in json_lines(shown)} == {"second"}
    failed(world.session_as(world.outsider, "list", "nomad"), 1, "ENOENT", "nomad")


def test_an_agent_that_never_existed_is_enoent_naming_the_list_command(world):
    """docs/sessions.md (an agent that does not exist and has no sessions is ENOENT, exit 1,
    and so is a session or a shared space that does not exist; the message names ``ctx
    session list``): ``list``/``show``/``tail``/``repair`` of ``ghost`` in a home, a session
    of ``ghost`` in a space, and a space that does not exist."""
    for args in (("list", "ghost"), ("list", "ghost", "--json"), ("show", "ghost"),
                 ("tail", "ghost", "s", "--json"), ("repair", "ghost", "s")):  # fmt: skip
        failed(world.session(*args), 1, "ENOENT", "ghost")
    r = world.session("show", "ghost", "s", "--project", "sp1")
    failed(r, 1, "ENOENT", "ctx session list ghost --project sp1")
    for args in (
        ("list", "alpha", "--project", "nospace"),
        ("show", "alpha", "--project", "nospace"),
    ):
        failed(world.session(*args), 1, "ENOENT", "nospace")
    assert not (world.storage / "shared" / "nospace").exists()
    assert not (world.storage / "shared" / "sp1" / "agent" / "ghost").exists()


def test_an_agent_that_never_existed_is_enoent_also_with_project_or_uid(world):
    """docs/sessions.md (an agent that does not exist and has no sessions is ENOENT, exit 1):
    a mistyped agent name with ``--project sp1`` or ``--uid`` of a real home must not be
    answered with an empty list and exit 0, as if the agent had no sessions yet."""
    for options in (("--project", "sp1"), ("--uid", str(world.a.uid))):
        r = world.session("list", "alpah", *options)
        failed(r, 1, "ENOENT", "alpah")


# ------------------------------------------------------------------ numbers and names


BAD_UIDS = ["-1", "4294967295", "18446744073709551616", "0x10", "+5", " 5", "", "５"]


@pytest.mark.parametrize("uid", BAD_UIDS)
def test_a_uid_out_of_range_or_not_decimal_is_a_usage_error(world, uid):
    """docs/sessions.md (``--uid`` is a uid, 0 to 4294967294; any other number is EINVAL,
    exit 2): ``list`` and, in turn, ``show``, ``tail`` or ``repair`` refuse it before
    reading, ``--json`` with the error as JSON."""
    command = ("show", "tail", "repair")[BAD_UIDS.index(uid) % 3]
    for args in (("list", "alpha"), (command, "alpha", "s", "--json")):
        r = world.session(*args, "--uid", uid)
        failed(r, 2, "EINVAL", "--uid")


def test_uid_and_tail_count_at_their_bounds(world):
    """docs/sessions.md: ``--uid 4294967294`` (the largest) is a home with no sessions of
    ``alpha`` (``list`` prints nothing, ``show`` is ENOENT naming ``ctx session list alpha
    --uid 4294967294``); ``tail -n`` takes 0 (prints nothing) and 2^63 - 1 (prints every
    event) and refuses 2^63 and -1 (EINVAL, exit 2)."""
    top = "4294967294"
    assert listed(world.session("list", "alpha", "--uid", top)) == []
    assert listed_json(world.session("list", "alpha", "--uid", top, "--json")) == []
    failed(world.session("show", "alpha", "--uid", top), 1, "ENOENT",
           f"ctx session list alpha --uid {top}")  # fmt: skip
    assert not (world.storage / "home" / top).exists()

    every = json_lines(world.session("show", "alpha", "--json"))
    assert len(every) >= 2
    r = world.session("tail", "alpha", "-n", "0")
    assert r.rc == 0 and r.out == "", r
    assert (
        json_lines(world.session("tail", "alpha", "-n", "9223372036854775807", "--json")) == every
    )
    assert json_lines(world.session("tail", "alpha", "-n", "1", "--json")) == every[-1:]
    for count in ("9223372036854775808", "-1", "1.5", "ten"):
        failed(world.session("tail", "alpha", "-n", count), 2, "EINVAL")


def test_names_at_the_r3_limits_in_homes_and_spaces(world):
    """R-3 (1 to 64 bytes; not ending in ``.d``): the agent named with 64 bytes records a
    session named with 64 bytes in its home and in ``sp2``; ``list`` shows it in both, and
    ``show``/``tail``/``repair`` reach it given as SESSION or ``--session`` (both at once when
    equal).  A 65-byte session or agent, a ``.d`` name, a leading dot or dash and two
    different sessions given at once are usage errors (EINVAL, exit 2) that make nothing."""
    world.record(LONGEST, LONGEST)
    world.record(LONGEST, LONGEST, "--project", "sp2")
    forms = ((LONGEST,), ("--session", LONGEST), (LONGEST, "--session", LONGEST))
    for i, options in enumerate(((), ("--project", "sp2"))):
        assert LONGEST in listed(world.session("list", LONGEST, *options))
        events = json_lines(world.session("show", LONGEST, *forms[i], *options, "--json"))
        assert {(e["agent"], e["session"]) for e in events} == {(LONGEST, LONGEST)}
        tail = json_lines(world.session("tail", LONGEST, *forms[i + 1], *options, "-n", "1",
                                        "--json"))  # fmt: skip
        assert tail == events[-1:]
        repaired = world.session("repair", LONGEST, LONGEST, *options, "--json")
        assert repaired.rc == 0 and repaired.json()["truncated_bytes"] == 0, repaired
        assert repaired.json()["session"].endswith(f"/agent/{LONGEST}/session/{LONGEST}")

    before = sorted(os.listdir(world.home_sessions(LONGEST)))
    bad = [
        (LONGEST, TOO_LONG),
        (LONGEST, "--session", "x.d"),
        (LONGEST, "--session=.hidden"),
        (LONGEST, "--session=-dash"),
        (TOO_LONG, "default"),
        (LONGEST, "a", "--session", "b"),
    ]
    for i, args in enumerate(bad):
        failed(world.session(("show", "tail", "repair")[i % 3], *args), 2, "EINVAL")
    failed(world.session("list", TOO_LONG), 2, "EINVAL", "65 bytes")
    failed(world.session("list", LONGEST, "--project", "L" * 65), 2, "EINVAL")
    assert sorted(os.listdir(world.home_sessions(LONGEST))) == before


# ------------------------------------------------------------------ damaged sessions


def test_damaged_session_directories_in_a_home(world):
    """S-1, S-5, docs/sessions.md (the commands reach the session without following links;
    a session with no events is ENOENT; repair names what it leaves in a warning): beside a
    good session ``wreck`` holds a directory without ``events.jsonl``, a regular file and a
    link at session names, a session whose group-readable ``events.jsonl`` is uid b's, and
    one nobody may read.  ``list`` names the directories (not
    the file nor the link); ``show``/``tail``/``repair`` refuse the empty one (ENOENT), the
    file and the link (ENOTDIR, naming them, never printing the link's target); root reads
    the other uid's and the unreadable one; ``repair`` of the other uid's changes nothing and
    names the file under ``left``."""
    parent = world.home_sessions("wreck")
    world.make_by_hand("wreck", ["good", "stranger", "sealed"])
    (parent / "noevents").mkdir(mode=0o700)
    os.chown(parent / "noevents", world.a.uid, world.a.gid)
    (parent / "plainfile").write_text("not a session\n")
    (parent / "linked").symlink_to(parent / "good")
    os.chown(parent / "stranger" / "events.jsonl", world.b.uid, world.b.gid)
    (parent / "stranger" / "events.jsonl").chmod(0o640)
    (parent / "sealed").chmod(0)

    names = listed(world.session("list", "wreck"))
    assert {"good", "noevents", "sealed", "stranger"} <= set(names), names
    assert not {"plainfile", "linked"} & set(names), names
    assert names == sorted(n for n in os.listdir(parent) if (parent / n).is_dir()
                           and not (parent / n).is_symlink()), names  # fmt: skip
    for command in ("show", "tail", "repair"):
        failed(world.session(command, "wreck", "noevents", "--json"), 1, "ENOENT",
               "noevents", "events.jsonl")  # fmt: skip
        for odd in ("plainfile", "linked"):
            r = world.session(command, "wreck", odd, "--json")
            failed(r, 1, "ENOTDIR", str(parent / odd))
            assert '"type":"note"' not in r.out, r
    for name in ("stranger", "sealed"):
        events = json_lines(world.session("show", "wreck", name, "--json"))
        assert [e["session"] for e in events] == [name]
    kept = (parent / "stranger" / "events.jsonl").stat()
    repaired = world.session("repair", "wreck", "stranger", "--json")
    assert repaired.rc == 0, repaired
    report = repaired.json()
    assert report["truncated_bytes"] == 0 and len(report["left"]) == 1, repaired
    assert str(parent / "stranger" / "events.jsonl") in report["left"][0], repaired
    assert "ctx: warning:" in repaired.err, repaired
    after = (parent / "stranger" / "events.jsonl").stat()
    assert (after.st_mode, after.st_uid, after.st_size) == (kept.st_mode, kept.st_uid,
                                                            kept.st_size)  # fmt: skip
    assert (parent / "plainfile").read_text() == "not a session\n"


@pytest.mark.parametrize("damage", ["session is a file", "session is a link",
                                    "agent directory is a link"])  # fmt: skip
def test_a_damaged_session_parent_is_enotdir_for_every_command(world, damage):
    """docs/sessions.md (``list`` reaches the sessions the same way, following no link):
    when ``session/`` of agent ``wreck`` is a regular file or a link to another agent's
    sessions, or ``agent/wreck`` in the home a link, each command is ENOTDIR naming the
    entry, exit 1, prints none of the other agent's sessions, and changes nothing."""
    home_agent = world.home_sessions("wreck").parent
    parent = home_agent / "session"
    aside = home_agent.with_name("wreck-aside")
    before = listed(world.session("list", "wreck"))
    os.rename(home_agent, aside)
    home_agent.mkdir(mode=0o700)
    if damage == "session is a file":
        parent.write_text("x\n")
        named = parent
    elif damage == "session is a link":
        parent.symlink_to(world.home_sessions("many"))
        named = parent
    else:
        home_agent.rmdir()
        home_agent.symlink_to(world.home_sessions("many").parent)
        named = home_agent
    try:
        for args in (("list", "wreck", "--json"), ("show", "wreck", "s000"),
                     ("repair", "wreck", "s000")):  # fmt: skip
            r = world.session(*args)
            failed(r, 1, "ENOTDIR", str(named))
            assert "s000" not in r.out, r
    finally:
        if home_agent.is_symlink() or home_agent.is_file():
            home_agent.unlink()
        else:
            shutil.rmtree(home_agent)
        os.rename(aside, home_agent)
    assert listed(world.session("list", "wreck")) == before


# ------------------------------------------------------------------ who sees what


def test_what_the_owner_a_member_and_an_outsider_see(world):
    """S-6, X-1, docs/sessions.md (a home session is its agent's alone; a space's group reads
    its sessions): uid a lists and shows alpha's home sessions; uid b (a member) is refused
    alpha's home (EACCES naming it) but lists and shows alpha's sessions in ``sp1``; the
    outsider is refused the space (EACCES naming it), yet told ENOENT for a space that does
    not exist; nobody's refusal prints a session's name or event."""
    world.record("alpha", "seen", "--project", "sp1")
    world.record("alpha", "private")
    assert "private" in listed(world.session_as(world.a, "list", "alpha"))
    own = json_lines(world.session_as(world.a, "show", "alpha", "private", "--json"))
    assert {e["session"] for e in own} == {"private"}

    home = world.storage / "home" / str(world.a.uid) / "agent"
    for args in (("list", "alpha"), ("list", "alpha", "--json"),
                 ("list", "alpha", "--uid", str(world.a.uid)),
                 ("show", "alpha", "private"), ("tail", "alpha", "private", "--json"),
                 ("repair", "alpha", "private")):  # fmt: skip
        r = world.session_as(world.b, *args)
        failed(r, 1, "EACCES", str(home))
        assert "private" not in r.out, r
    member = listed(world.session_as(world.b, "list", "alpha", "--project", "sp1"))
    assert "seen" in member, member
    shown = json_lines(world.session_as(world.b, "show", "alpha", "seen", "--project", "sp1",
                                        "--json"))  # fmt: skip
    assert {e["agent"] for e in shown} == {"alpha"}

    space = world.storage / "shared" / "sp1"
    for args in (("list", "alpha", "--project", "sp1", "--json"),
                 ("show", "alpha", "seen", "--project", "sp1"),
                 ("tail", "alpha", "seen", "--project", "sp1")):  # fmt: skip
        r = world.session_as(world.outsider, *args)
        failed(r, 1, "EACCES", str(space))
        assert "seen" not in r.out, r
    r = world.session_as(world.outsider, "list", "alpha", "--project", "nospace")
    failed(r, 1, "ENOENT", "nospace")


def test_a_damaged_identity_is_reported_and_uid_gets_around_it(world):
    """docs/sessions.md (the home's uid defaults to the agent's identity): with ``beta``'s
    identity control not JSON, ``list`` and ``show`` without ``--uid`` fail (exit 1) naming
    the control and ``--uid``; with ``--uid`` they read beta's home."""
    identity = world.storage / "agent" / "beta.d" / "identity"
    kept = identity.read_bytes()
    identity.write_text("not json\n")
    try:
        for args in (("list", "beta"), ("show", "beta", "--json")):
            r = world.session(*args)
            assert r.rc == 1 and "Traceback" not in r.err, r
            assert "agent/beta.d/identity" in r.err and "--uid" in r.err, r
        names = listed(world.session("list", "beta", "--uid", str(world.b.uid)))
        assert "default" in names, names
        assert json_lines(world.session("show", "beta", "--uid", str(world.b.uid), "--json"))
    finally:
        identity.write_bytes(kept)


def test_a_session_directory_that_may_be_read_but_not_searched_is_not_listed_as_empty(world):
    """S-1, docs/sessions.md: uid a makes ``session/`` of agent ``many`` mode 0600 (read,
    no search).  ``list`` as uid a must not answer "no sessions" (an empty list, exit 0)
    while ``show`` of one of the same sessions is refused with EACCES: either the names or
    the refusal."""
    parent = world.home_sessions("many")
    with mode_for_a_while(parent, 0o600):
        shown = world.session_as(world.a, "show", "many", "s000")
        failed(shown, 1, "EACCES", str(parent))
        r = world.session_as(world.a, "list", "many", "--json")
        assert r.rc == 1 or json.loads(r.out) != [], r


def test_repair_of_an_events_file_its_owner_may_not_read_names_the_whole_path(world):
    """docs/sessions.md ("naming the file"): uid a makes the ``events.jsonl`` of alpha's home
    session ``locked`` mode 0000.  ``show`` and ``tail`` refuse it (EACCES) naming its whole
    path; ``repair`` (text and ``--json``) must too, and the file stays as it was."""
    world.record("alpha", "locked")
    events = world.home_sessions("alpha") / "locked" / "events.jsonl"
    kept = events.read_bytes()
    with mode_for_a_while(events, 0):
        for args in (("show",), ("tail", "--json"), ("repair",), ("repair", "--json")):
            r = world.session_as(world.a, args[0], "alpha", "locked", *args[1:])
            failed(r, 1, "EACCES", str(events))
    assert events.read_bytes() == kept


# ------------------------------------------------------------------ listed while written


def test_listing_while_sessions_are_made_written_and_removed(world):
    """S-1, S-5: while uid a makes 150 sessions of ``churn`` by hand and removes every third
    one it made, and ``ctx run`` records calls in ``churn``'s session ``busy`` over and over,
    ``list`` (text and ``--json``), ``show --json`` and ``tail -n 3 --json`` run again and
    again: each listing is sorted, without duplicates, holds every session that existed
    before and stays and only names that were or are sessions; every printed event is whole
    JSON of session ``busy``, ``tail`` prints at most 3 and ``show`` never fewer than before.
    Once the writers are done, ``list`` names exactly what is there."""
    parent = world.home_sessions("churn")
    stable = [f"keep-{i}" for i in range(20)]
    world.make_by_hand("churn", stable)
    world.record("churn", "busy")
    made = [f"live-{i:03d}" for i in range(150)]
    removed = [name for i, name in enumerate(made) if i % 3 == 0]
    script = MAKE_SESSIONS.replace('    mkdir -- "$name"',
                                   '    case $name in rm-*) rm -rf -- "${name#rm-}"; continue;; '
                                   'esac\n    mkdir -- "$name"')  # fmt: skip
    order: list[str] = []
    for i, name in enumerate(made):
        order.append(name)
        if i % 3 == 2:
            order.append("rm-" + made[i - 2])
    groups = [world.gid]
    maker = subprocess.Popen(["/bin/sh", "-c", script, "sh", str(parent), "churn", *order],
                             user=world.a.uid, group=world.a.gid, extra_groups=groups,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    recorder = subprocess.Popen(
        ["/bin/sh", "-c", 'for i in $(seq 6); do echo "{}" | "$@" || exit 1; done', "sh",
         *CTX_ARGV, "run", "--agent", "churn", "--session", "busy", "--native", "demo.echo"],
        env=world.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    allowed = {"default", "busy", *stable, *made}
    rounds = 0
    shown_before = 0
    try:
        while rounds < 6 or maker.poll() is None or recorder.poll() is None:
            rounds += 1
            names = listed(world.session("list", "churn"))
            assert names == sorted(set(names)), names
            assert set(stable) <= set(names) <= allowed, names
            document = listed_json(world.session("list", "churn", "--json"))
            assert [e["name"] for e in document] == sorted({e["name"] for e in document})
            assert set(stable) <= {e["name"] for e in document} <= allowed
            shown = json_lines(world.session("show", "churn", "busy", "--json"))
            assert {e["session"] for e in shown} == {"busy"}
            assert len(shown) >= shown_before, (len(shown), shown_before)
            shown_before = len(shown)
            tail = json_lines(world.session("tail", "churn", "busy", "-n", "3", "--json"))
            assert 1 <= len(tail) <= 3 and {e["session"] for e in tail} == {"busy"}, tail
            assert rounds < 400, "the writers did not end"
    finally:
        for proc in (maker, recorder):
            if proc.poll() is None:
                proc.kill()
        maker.wait(timeout=30)
        recorder.wait(timeout=30)
    assert maker.returncode == 0, maker.stderr.read() if maker.stderr else ""
    assert recorder.returncode == 0, recorder.stderr.read() if recorder.stderr else ""
    assert wait_for(lambda: not os.path.exists(parent / removed[-1]), 5)
    final = sorted(name for name in os.listdir(parent) if (parent / name).is_dir())
    assert final == sorted({"default", "busy", *stable, *(set(made) - set(removed))})
    assert listed(world.session("list", "churn")) == final
    events = json_lines(world.session("show", "churn", "busy", "--json"))
    assert len(events) == 2 * 7, len(events)
    calls = [e["call"] for e in events]
    assert all(calls.count(call) == 2 for call in calls), calls
