"""The error branches of agents, policy, sessions, shared spaces and ctxmcp, each reached from
outside as a user reaches it, and judged by SPEC, the docs and the help texts.

The angle: every refusal these commands can give a user who hands them odd arguments
(``ctx policy explain --location``/``--peer``, a word missing from a rule, two session names,
a home and a space at once, ``--group`` and ``--user`` values no database knows), controls
edited by hand (an agent's ``identity`` and ``mount`` table), odd session directories (no
``events.jsonl``, listable but not searchable, a log another process keeps locked), odd
configurations and small stdio MCP servers written here that break the protocol while they
list their tools, a shared space with a directory of another owner, and a second real user
(a storage root of its own, a session directory it may not search).  Each refusal is checked
for the documented exit status, the errno word of the ``PROG: ERRNO: …`` line (and of the
``--json`` error object where the command has one), that the message names what is at fault
and what to do where the docs say so, and that nothing is left half-done: no agent, space,
session file, candidate directory, terminal, ``/run`` entry or server process of the refused
command.

SPEC ids: §5 P-1..P-8 (``ctx policy check|query|explain``), §8 A-1..A-3 (``ctx agent create|
start|stop``, ``bin/ctxterm``), §4 S-1, S-5 (``ctx session show|tail|repair|list``), §9 X-1
(``ctx shared create``), §10 M-1..M-3 (``ctxmcp list|project``).  Docs: docs/policy.md
(*Commands*, *What the chain reads*), docs/sessions.md (*Appending, crash-safely*, *Reading,
torn lines and repair*), docs/tools.md (*Agents, host side*, *The agent terminal*, *MCP
servers as tool sources*) and the ``--help`` texts of those commands."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
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
    alive,
    clean_env,
    ctx_run,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import CoderHost, coder_host
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
BIN = Path(CTX_ARGV[0]).parent
CTXMCP = BIN / "ctxmcp"
PYTHON = sys.executable
RUN_BASE = Path("/run/cortexfs/terminal")
NOBODY = 65534
MAX_ID = 4294967294  # (uid_t)-1 is no id

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (agents run as nobody)")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# -------------------------------------------------------------------------- common checks


def refused(run: Run, errno_name: str, status: int, prog: str = "ctx") -> None:
    """``run`` ended with ``status``, said ``PROG: ERRNO: …`` on standard error, and printed
    no traceback."""
    assert run.rc == status, run
    assert f"{prog}: {errno_name}: " in run.err, run
    assert "Traceback" not in run.err, run


def refused_json(run: Run, errno_name: str, status: int, prog: str = "ctx") -> dict:
    """As :func:`refused`, for a ``--json`` run: its stdout is the error object alone, and
    says what stderr says."""
    refused(run, errno_name, status, prog)
    error = run.json()
    assert error["error"] == errno_name and isinstance(error["errno"], int), run
    assert error["message"] in run.err, run
    return error


def as_user(
    user: UnprivilegedUser, *args, storage: Path | None, program: Path | None = None
) -> Run:
    """``ctx ARGS`` (or ``PROGRAM ARGS``) as ``user`` (its own group only) in ``/``, on
    ``storage`` through ``CTX_STORAGE`` when given."""
    env = clean_env(HOME="/nonexistent")
    if storage is not None:
        env["CTX_STORAGE"] = str(storage)
    argv = [*CTX_ARGV] if program is None else [str(program)]
    done = subprocess.run(
        [*argv, *map(str, args)],
        input=b"",
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env,
        cwd="/",
        timeout=60,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def root_key(storage: Path) -> str:
    """The storage root's key in ``/run/cortexfs/terminal`` (docs/tools.md)."""
    return hashlib.sha256(os.fsencode(os.path.realpath(storage))).hexdigest()[:16]


def modes(top: Path) -> dict[str, tuple[int, int, int]]:
    """Owner, group and mode of ``top`` and of every entry below it (links not followed)."""
    found = {".": _ids_and_mode(top)}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            found[str(path.relative_to(top))] = _ids_and_mode(path)
    return found


def _ids_and_mode(path: Path) -> tuple[int, int, int]:
    status = path.lstat()
    return status.st_uid, status.st_gid, status.st_mode


def unused_id() -> int:
    """A uid that the user database does not know."""
    for candidate in range(4_000_000, 4_001_000):
        try:
            pwd.getpwuid(candidate)
        except KeyError:
            return candidate
    pytest.skip("no unknown uid found")


EVENT = {
    "ts": "2026-06-22T12:00:00Z",
    "type": "tool_call",
    "agent": "coder",
    "session": "s1",
    "object": "tool/fs.read",
    "status": "ok",
}


@dataclass
class World(OnStorage):
    """A storage root below this file's scratch directory that every uid may search, with
    agent ``coder`` (label ``coder_t``, ``fs.read`` in its request) running as nobody."""

    top: Path
    storage: Path

    def control(self, name: str) -> Path:
        return self.storage / "agent" / "coder.d" / name

    def home_session(self, uid: int, session: str, agent: str = "coder") -> Path:
        """``home/UID/agent/AGENT/session/SESSION``, made as a call would make it: the home
        0755 and what is below it 0700, all the uid's; the session's events are not made."""
        home = self.storage / "home" / str(uid)
        home.mkdir(exist_ok=True)
        home.chmod(0o755)
        os.chown(home, uid, uid)
        path = home
        for part in ("agent", agent, "session", session):
            path = path / part
            path.mkdir(exist_ok=True)
            path.chmod(0o700)
            os.chown(path, uid, uid)
        return path

    def events_in(self, session_dir: Path, *lines: bytes) -> Path:
        events = session_dir / "events.jsonl"
        events.write_bytes(b"".join(lines))
        events.chmod(0o600)
        st = session_dir.stat()
        os.chown(events, st.st_uid, st.st_gid)
        return events


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP)
    storage = copy_of_root(_template, top / "storage")
    made = World(top, storage)
    if os.geteuid() == 0:
        made.create_agent({"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    try:
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------- policy (P-1..P-8)


ONE_PLACE = [
    ("model:openai/gpt-5.6", "use"),
    ("shared:proj", "read"),
    ("agent:coder", "start"),
    ("mount:ctx", "read"),
    ("network:default", "connect"),
]


@needs_root
def test_explain_refuses_a_location_for_an_object_that_has_one_place(world):
    """docs/policy.md: ``--location`` names where a tool or a session lives; for any other
    class it is a malformed request: EINVAL, exit 2, no verdict on stdout (the error object
    alone with --json), naming the class."""
    for obj, perm in ONE_PLACE:
        cls = obj.split(":")[0]
        for args in ((), ("--json",)):
            run = world.ctx("policy", "explain", "coder", obj, perm, "--location", "tool", *args)
            refused(run, "EINVAL", 2)
            assert f"a {cls} object has one place; do not give a location" in run.err, run
            if args:
                assert run.json()["error"] == "EINVAL", run
            else:
                assert run.out == "", run


@needs_root
def test_explain_of_a_session_needs_its_location_and_never_the_manual_bundle(world):
    """docs/policy.md: a session is named by its directory, ``--location`` "required for
    sessions"; the manual bundle (X-2) holds neither sessions nor a tool tier.  Each is a
    malformed request (EINVAL, exit 2) that says what to give."""
    run = world.ctx("policy", "explain", "coder", "session:s1", "read", "--json")
    error = refused_json(run, "EINVAL", 2)
    assert "give its location, e.g. home/1000/agent/coder/session" in error["message"], run

    docs = "shared/cortexfs-docs"
    for obj, location, holds in (
        ("session:s1", f"{docs}/agent/coder/session", "holds no sessions"),
        ("tool:fs.read", f"{docs}/tool", "holds no tier: no tool there is ever run"),
    ):
        perm = "read" if obj.startswith("session") else "execute"
        run = world.ctx("policy", "explain", "coder", obj, perm, "--location", location)
        refused(run, "EINVAL", 2)
        bundle = "lies in cortexfs-docs, the system-maintained manual bundle (X-2)"
        assert f"'{location}' {bundle}" in run.err, run
        assert holds in run.err and run.out == "", run


PEERS = [
    ("1000", "must be UID:GID, e.g. 1000:1000"),
    ("1000:", "must be UID:GID, e.g. 1000:1000"),
    ("a:b", "must be UID:GID, e.g. 1000:1000"),
    ("1:2:3", "must be UID:GID, e.g. 1000:1000"),
    ("-1:0", "must be UID:GID, e.g. 1000:1000"),
    ("1:4294967295", f"a uid or gid is at most {MAX_ID}"),
    ("99999999999999999999:1", f"a uid or gid is at most {MAX_ID}"),
]


@needs_root
def test_explain_takes_a_peer_of_two_ids_only(world):
    """``--peer UID:GID`` (docs/policy.md): anything else is a malformed request, EINVAL,
    exit 2, quoting what was given and no verdict; the largest ids, 4294967294, are taken
    and judged at step 1."""
    for peer, says in PEERS:
        run = world.ctx("policy", "explain", "coder", "tool:fs.read", "execute", "--peer", peer)
        refused(run, "EINVAL", 2)
        assert f"--peer '{peer}'" in run.err and says in run.err and run.out == "", run
    largest = f"{MAX_ID}:{MAX_ID}"
    taken = world.ctx("policy", "explain", "coder", "tool:fs.read", "execute", "--peer", largest)
    assert taken.rc == 1, taken
    assert f"the caller is uid {MAX_ID} gid {MAX_ID}, but agent 'coder' is uid" in taken.out


@needs_root
def test_an_object_without_a_colon_is_einval_in_query_explain_and_a_policy_file(world):
    """P-3, P-8: ``CLASS:NAME`` without its colon is no object: ``query`` and ``explain`` exit
    2 with EINVAL saying what is expected; in a policy file the line is reported as
    ``FILE:LINE: EINVAL: …`` and ``check`` exits 1."""
    policy = world.top / "p.policy"
    policy.write_text("allow coder_t tool:fs.read execute\nallow coder_t toolfs.read execute\n")
    expected = "'toolfs.read' is not an object; expected CLASS:NAME, e.g. tool:fs.read"

    query = world.ctx("policy", "query", "--policy", policy, "coder_t", "toolfs.read", "execute")
    refused(query, "EINVAL", 2)
    assert expected in query.err and query.out == "", query
    explain = world.ctx("policy", "explain", "coder", "toolfs.read", "execute", "--json")
    assert refused_json(explain, "EINVAL", 2)["message"] == expected

    check = world.ctx("policy", "check", policy, "--json")
    assert check.rc == 1, check
    assert check.err == f"{policy}:2: EINVAL: {expected}\n", check
    [report] = check.json()["files"]
    assert report["valid"] is False
    assert [(p["line"], p["error"]) for p in report["problems"]] == [(2, "EINVAL")], report


def test_check_names_the_word_an_incomplete_rule_lacks_and_lists_the_classes(tmp_path):
    """P-1, P-3, P-8: every invalid line is reported (not only the first), each naming what
    is wrong: which of the three words after ``allow`` is missing, and for an unknown class,
    the classes there are."""
    policy = tmp_path / "incomplete.policy"
    policy.write_text(
        "# a comment\n"
        "allow\n"
        "allow coder_t\n"
        "allow coder_t tool:fs.read\n"
        "allow coder_t file:notes read\n"
        "allow coder_t tool:fs.read execute\n"
    )
    run = ctx_run("policy", "check", policy, "--json")
    assert run.rc == 1, run
    shape = "expected 'allow SUBJECT CLASS:NAME PERMISSION'"
    assert run.err.splitlines() == [
        f"{policy}:2: EINVAL: incomplete rule: the subject type is missing; {shape}",
        f"{policy}:3: EINVAL: incomplete rule: the CLASS:NAME object is missing; {shape}",
        f"{policy}:4: EINVAL: incomplete rule: the permission is missing; {shape}",
        f"{policy}:5: EINVAL: unknown class 'file'; the classes are tool, model, shared, "
        "session, mount, agent, network",
    ], run
    [report] = run.json()["files"]
    assert [p["line"] for p in report["problems"]] == [2, 3, 4, 5], report
    assert {p["errno"] for p in report["problems"]} == {22}, report


# ------------------------------------------------------- hand-edited agent controls

IDENTITIES = {
    "a fourth key": (
        {"uid": NOBODY, "gid": NOBODY, "groups": [], "home": "/"},
        'expected exactly {"uid": N, "gid": N, "groups": [N, ...]}',
    ),
    "a list": ([NOBODY, NOBODY, []], 'expected exactly {"uid": N, "gid": N, "groups": [N, ...]}'),
    "groups a number": (
        {"uid": NOBODY, "gid": NOBODY, "groups": NOBODY},
        "groups must be a list of group ids",
    ),
    "a negative uid": (
        {"uid": -1, "gid": NOBODY, "groups": []},
        f"-1 is not a uid or gid (an integer from 0 to {MAX_ID})",
    ),
    "(gid_t)-1 among the groups": (
        {"uid": NOBODY, "gid": NOBODY, "groups": [4294967295]},
        f"4294967295 is not a uid or gid (an integer from 0 to {MAX_ID})",
    ),
}


@needs_root
@pytest.mark.parametrize("case", sorted(IDENTITIES))
def test_a_hand_edited_identity_is_named_by_list_explain_run_and_session_commands(world, case):
    """docs/policy.md, *What the chain reads*: a damaged identity is reported naming the file
    and what is wrong; ``ctx agent list`` shows no identity and that problem, ``policy
    explain`` denies at step 1 with EACCES, ``ctx run`` refuses (126) before anything runs or
    is recorded, and a session command that needs the agent's uid says which file to fix, or
    to give ``--uid`` (which then works)."""
    content, reason = IDENTITIES[case]
    session = world.home_session(NOBODY, "s1")
    world.events_in(session, json.dumps(EVENT).encode() + b"\n")
    world.control("identity").write_text(json.dumps(content) + "\n")
    said = f"agent/coder.d/identity is invalid: {reason}"
    before = snapshot(world.storage / "home")

    listed = world.ctx("agent", "list", "--json")
    assert listed.rc == 0, listed
    [entry] = listed.json()
    assert (entry["name"], entry["label"], entry["identity"]) == ("coder", "coder_t", None)
    assert entry["problems"] == [said], entry

    explained = world.ctx("policy", "explain", "coder", "tool:fs.read", "execute", "--json")
    assert explained.rc == 1, explained
    facts = explained.json()
    assert (facts["allowed"], facts["step"], facts["errno"]) == (False, 1, "EACCES"), facts
    assert said in facts["reason"], facts

    ran = world.ctx("run", "--agent", "coder", "fs.read", '{"path": "x"}')
    refused(ran, "EACCES", 126)
    assert said in ran.err, ran

    shown = world.ctx("session", "show", "coder", "s1")
    refused(shown, "EACCES", 1)
    fix = "fix agent/coder.d/identity, or give --uid"
    assert f"cannot tell agent 'coder''s uid: {said}; {fix}" in shown.err, shown
    by_uid = world.ctx("session", "show", "coder", "s1", "--uid", str(NOBODY), "--json")
    assert by_uid.rc == 0 and json.loads(by_uid.out) == EVENT, by_uid
    assert snapshot(world.storage / "home") == before  # nothing was recorded or made


MOUNT_TABLES = {
    "not JSON": (b"[[/srv, /data, ro]]\n", "the mount table is not JSON: "),
    "an object": (
        b'{"/srv": ["/data", "ro"]}\n',
        "the mount table must be a JSON array of [source, target, mode] triples",
    ),
    "a pair": (b'[["/srv", "/data"]]\n', "mount entry 1 must be a [source, target, mode] triple"),
    "a relative target": (
        b'[["/srv", "data", "ro"]]\n',
        "mount entry 1: the target must be an absolute path, not 'data'",
    ),
    "a mode of its own": (b'[["/srv", "/data", "rx"]]\n', "mode 'rx' must be 'ro' or 'rw'"),
}


@needs_root
@pytest.mark.parametrize("case", sorted(MOUNT_TABLES))
def test_a_hand_edited_mount_table_is_a_problem_and_denies_at_step_3(world, case):
    """``ctx agent show`` (help: "a label, policy or mount control that is unusable (and so
    grants nothing) as a problem") and ``ctx agent list`` name the control and what is wrong,
    the agent gets no mount at all, and the chain denies at step 3 with EACCES naming it."""
    content, reason = MOUNT_TABLES[case]
    world.control("mount").write_bytes(content)

    shown = world.ctx("agent", "show", "coder", "--json")
    assert shown.rc == 0, shown
    facts = shown.json()
    assert facts["mounts"] == [] and facts["tool_mounts"] == [], facts
    [problem] = facts["problems"]
    assert problem.startswith("agent/coder.d/mount is invalid: ") and reason in problem, facts
    text = world.ctx("agent", "show", "coder")
    assert f"problem: {problem}" in text.lines(), text

    listed = world.ctx("agent", "list", "--json")
    assert listed.json()[0]["problems"] == [problem], listed

    explained = world.ctx("policy", "explain", "coder", "tool:fs.read", "execute")
    assert explained.rc == 1, explained
    assert explained.lines()[-1] == f"deny: EACCES: step 3 (mount visibility): {problem}", explained


@needs_root
def test_explain_of_a_mount_the_agent_lacks_has_withheld_or_has_read_only(world):
    """docs/policy.md: ``mount:N`` is named by the last component of the mount's target;
    docs/tools.md: a mount whose target is a system directory is withheld.  A name no mount
    has is ENOENT at step 2; the withheld mount is EACCES naming why (as ``agent show``
    lists it), and writing through a read-only mount is EACCES at step 3, even with
    ``mount:data write`` in the policy and a source every uid may write."""
    data = world.top / "data"
    data.mkdir()
    data.chmod(0o777)
    table = json.loads(world.control("mount").read_text())
    table[:0] = [[str(data), "/data", "ro"], [str(world.top), "/etc/x", "ro"]]
    world.control("mount").write_text(json.dumps(table) + "\n")
    with world.control("policy").open("a") as rules:
        rules.write("allow coder_t mount:data read\nallow coder_t mount:data write\n")
        rules.write("allow coder_t mount:x read\n")

    def verdict(obj: str, perm: str) -> dict:
        run = world.ctx("policy", "explain", "coder", obj, perm, "--json")
        assert run.rc == (0 if run.json()["allowed"] else 1), run
        return run.json()

    missing = verdict("mount:nosuch", "read")
    assert (missing["step"], missing["errno"]) == (2, "ENOENT"), missing
    assert missing["reason"] == "step 2 (mode bits): agent 'coder' has no mount named 'nosuch'"

    withheld = verdict("mount:x", "read")
    why = "mount target /etc/x: /etc belongs to the system the agent's terminal runs on"
    assert (withheld["step"], withheld["errno"]) == (2, "EACCES"), withheld
    assert withheld["reason"].startswith(f"step 2 (mode bits): its mount 'x' is withheld: {why}")
    shown = world.ctx("agent", "show", "coder", "--json").json()
    [held] = shown["withheld_mounts"]
    assert held["mount"] == [str(world.top), "/etc/x", "ro"] and held["reason"].startswith(why)

    read_only = verdict("mount:data", "write")
    assert (read_only["step"], read_only["errno"]) == (3, "EACCES"), read_only
    assert read_only["reason"] == (
        f"step 3 (mount visibility): mount 'data' is read-only: {data} -> /data (ro)"
    )
    assert verdict("mount:data", "read")["allowed"] is True


@needs_root
def test_a_root_others_may_search_but_not_list_is_taken_by_storage_as_by_ctx_storage(
    world, unprivileged_user
):
    """R-1: ``CTX_STORAGE`` or ``--storage DIR`` selects the root, everywhere, and ``ctx
    --help``: "--storage may be given here or after the command".  A root of mode 0711 (the
    agents' uids search it; docs/policy.md asks only for x on the way) is read by another
    user through either, with the same answer: ``agent list`` lists the agents, ``policy
    explain`` gives the same verdict."""
    user = unprivileged_user
    world.storage.chmod(0o711)
    questions = [
        ("agent", "list", "--json"),
        ("policy", "explain", "coder", "tool:fs.read", "execute"),
    ]
    for question in questions:
        by_env = as_user(user, *question, storage=world.storage)
        assert by_env.rc in (0, 1) and "Traceback" not in by_env.err, by_env
        for given in (
            (*question, "--storage", world.storage),
            ("--storage", world.storage, *question),
        ):
            by_option = as_user(user, *given, storage=None)
            assert (by_option.rc, by_option.out) == (by_env.rc, by_env.out), (by_option, by_env)
    listed = as_user(user, "agent", "list", "--json", storage=world.storage)
    assert [agent["name"] for agent in listed.json()] == ["coder"], listed


# --------------------------------------------------------------- sessions (S-1, S-5)


@needs_root
def test_two_different_session_names_are_a_usage_error(world):
    """SESSION may be given as an argument or as ``--session``; two different names are a
    malformed command line (EINVAL, exit 2), with the error object for --json; the same name
    twice is one session."""
    session = world.home_session(NOBODY, "s1")
    events = world.events_in(session, json.dumps(EVENT).encode() + b"\n")
    for command in ("show", "tail", "repair"):
        run = world.ctx("session", command, "coder", "s1", "--session", "s2", "--json")
        error = refused_json(run, "EINVAL", 2)
        assert error["message"] == "two sessions given: 's1' and --session 's2'", run
        same = world.ctx("session", command, "coder", "s1", "--session", "s1")
        assert same.rc == 0, same
    assert events.read_bytes() == json.dumps(EVENT).encode() + b"\n"


@needs_root
def test_a_home_and_a_space_at_once_is_a_usage_error_that_makes_nothing(world):
    """S-1: a session lives in a home (``--uid``) or in a space (``--project``), never both:
    EINVAL, exit 2, naming both, before anything is looked at or made."""
    assert world.ctx("shared", "create", "proj").rc == 0
    before = snapshot(world.storage)
    for command in ("show", "tail", "repair", "list"):
        run = world.ctx("session", command, "coder", "--project", "proj", "--uid", "1000")
        refused(run, "EINVAL", 2)
        assert (
            "--project proj names a session in a shared space and --uid 1000 one in a home: "
            "give one of them"
        ) in run.err, run
        assert run.out == "", run
    assert snapshot(world.storage) == before


@needs_root
def test_a_session_without_events_jsonl_is_enoent_and_repair_makes_none(world):
    """docs/sessions.md: sessions are directories holding ``events.jsonl``; a session whose
    file is not there yet is ENOENT (exit 1) for ``show``, ``tail`` (also ``--follow``,
    which does not wait) and ``repair``, saying that nothing was recorded yet; none of them
    makes the file."""
    session = world.home_session(NOBODY, "empty")
    for args in (("show",), ("tail",), ("tail", "--follow"), ("repair", "--json")):
        started = time.monotonic()
        run = world.ctx("session", *args, "coder", "empty", timeout=30)
        refused(run, "ENOENT", 1)
        assert time.monotonic() - started < 15, run
        assert (
            "session home/65534/agent/coder/session/empty has no events.jsonl: nothing was "
            "recorded in it yet, or the file was removed"
        ) in run.err, run
        if "--json" in args:
            assert run.json()["error"] == "ENOENT", run
    assert os.listdir(session) == []


@needs_root
def test_sessions_of_a_removed_agent_in_two_homes_need_a_uid(world):
    """S-1: sessions outlive their agent.  With no agent ``gone`` and its sessions in the
    homes of uids 1000 and 1001, which one is meant cannot be told: EINVAL, exit 2, naming
    both uids and ``--uid``; with ``--uid`` the sessions are listed and shown.  A name no home
    holds sessions of is ENOENT, exit 1, not an empty list."""
    for uid, session in ((1000, "a"), (1001, "b")):
        made = world.home_session(uid, session, agent="gone")
        world.events_in(made, json.dumps({**EVENT, "agent": "gone"}).encode() + b"\n")
    for command in (("list",), ("show",), ("tail",)):
        run = world.ctx("session", *command, "gone", "--json")
        error = refused_json(run, "EINVAL", 2)
        assert error["message"] == (
            "there is no agent 'gone', and the homes of uids 1000, 1001 hold sessions of it; "
            "give --uid"
        ), run
    listed = world.ctx("session", "list", "gone", "--uid", "1001")
    assert (listed.rc, listed.out) == (0, "b\n"), listed
    shown = world.ctx("session", "show", "gone", "b", "--uid", "1001", "--json")
    assert shown.rc == 0 and json.loads(shown.out)["agent"] == "gone", shown

    nobody = world.ctx("session", "list", "ghost", "--json")
    error = refused_json(nobody, "ENOENT", 1)
    assert "there is no agent 'ghost'" in error["message"], nobody
    assert "no home holds sessions of it" in error["message"], nobody


@needs_root
def test_a_session_directory_listable_but_not_searchable_is_eacces_for_its_reader(
    world, unprivileged_user
):
    """``ctx session list`` run by a uid that may read the names of ``session/`` but not
    search it (mode 0744, root's) cannot tell sessions from other entries: EACCES, exit 1,
    naming the directory and that uid, never an empty list that would say there are none."""
    session = world.home_session(NOBODY, "s1")
    world.events_in(session, json.dumps(EVENT).encode() + b"\n")
    sessions = session.parent
    for level in (sessions.parents[2], sessions.parents[1], sessions.parent):
        level.chmod(0o755)  # home/65534, its agent/ and agent/coder: searchable by all
    os.chown(sessions, 0, 0)
    sessions.chmod(0o744)
    run = as_user(unprivileged_user, "session", "list", "coder", "--json", storage=world.storage)
    error = refused_json(run, "EACCES", 1)
    assert error["message"] == (
        f"{sessions} may be listed but not searched by uid {unprivileged_user.uid} (its mode "
        "lacks x for it), so its sessions cannot be told from its other entries"
    ), run
    as_root = world.ctx("session", "list", "coder")
    assert (as_root.rc, as_root.out) == (0, "s1\n"), as_root


LOCK_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(120)
"""


@needs_root
def test_repair_of_a_log_another_process_keeps_locked_gives_up_with_eagain(world):
    """docs/sessions.md: "Neither waits more than ten seconds: … a log kept locked longer
    fails the append (or repair) with EAGAIN, naming the file".  The torn line is left as it
    is while the lock is held (exit 1, the error object with --json, saying how to find the
    holder); once the holder is gone the same repair cuts it."""
    session = world.home_session(NOBODY, "s1")
    whole = json.dumps(EVENT).encode() + b"\n"
    events = world.events_in(session, whole, b'{"ts":"2026-06-22T12:00:01Z","ty')
    torn = events.read_bytes()
    holder = subprocess.Popen([PYTHON, "-c", LOCK_HOLDER, str(events)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        started = time.monotonic()
        run = world.ctx("session", "repair", "coder", "s1", "--json", timeout=60)
        waited = time.monotonic() - started
        error = refused_json(run, "EAGAIN", 1)
        said = error["message"]
        assert str(events) in said and "stayed locked by another process" in said, run
        assert "find it with 'fuser' and end it" in said, run
        assert 9 <= waited < 40, waited
        assert events.read_bytes() == torn
    finally:
        holder.kill()
        holder.wait()
    mended = world.ctx("session", "repair", "coder", "s1", "--json")
    assert mended.rc == 0 and mended.json()["truncated_bytes"] == len(torn) - len(whole), mended
    assert events.read_bytes() == whole


# ----------------------------------------------------------------- shared spaces


UNKNOWN_GROUPS = [
    ("no-such-group-here", "no such group: 'no-such-group-here'"),
    ("4294967295", f"'4294967295' is not a group id (at most {MAX_ID})"),
    ("", "no such group: ''"),
]


@needs_root
def test_a_group_no_database_knows_is_a_usage_error_and_no_space_is_made(world):
    """``ctx shared create NAME --group G`` (name or gid): a name the group database does not
    know, or a gid past the largest, is a malformed command line (EINVAL, exit 2) and nothing
    of the space is made."""
    before = snapshot(world.storage)
    for group, says in UNKNOWN_GROUPS:
        run = world.ctx("shared", "create", "proj", "--group", group, "--json")
        assert refused_json(run, "EINVAL", 2)["message"] == says, run
    assert snapshot(world.storage) == before


@needs_root
def test_a_user_may_not_give_a_space_a_group_they_are_not_in(unprivileged_user):
    """``ctx shared create`` help: "anyone else only their own: EPERM, nothing changed".  The
    owner of a storage root who is not root asks for group 0: EPERM, exit 1, saying what to
    do, before anything is made; a space made with its own group is then not regrouped to 0
    either, its entries as they were."""
    user = unprivileged_user
    top = new_scratch_dir(TOP)
    try:
        os.chown(top, user.uid, user.gid)
        storage = top / "storage"
        made = as_user(user, "bootstrap", "--storage", storage, storage=storage)
        assert made.rc == 0, made
        before = snapshot(storage)

        run = as_user(user, "shared", "create", "proj", "--group", "0", "--json", storage=storage)
        error = refused_json(run, "EPERM", 1)
        assert error["message"] == (
            "you are not a member of group 0, so you cannot give a shared space that group; "
            "join the group, or have root create the space"
        ), run
        assert snapshot(storage) == before

        own = as_user(user, "shared", "create", "proj", storage=storage)
        assert own.rc == 0, own
        space = storage / "shared" / "proj"
        kept = modes(space)
        assert kept["."][:2] == (user.uid, user.gid), kept
        again = as_user(user, "shared", "create", "proj", "--group", "0", storage=storage)
        refused(again, "EPERM", 1)
        assert modes(space) == kept
    finally:
        shutil.rmtree(top, ignore_errors=True)


@needs_root
def test_a_regroup_meeting_a_directory_of_another_owner_changes_nothing(world, unprivileged_user):
    """``ctx shared create`` help: "a directory of the space that belongs to another uid than
    the space's owner is not repaired but refused (EPERM, naming it, nothing changed)".  The
    space's ``data/`` given to the test user and made 2750: a regroup is refused naming it
    and the command that gives it back, and no entry of the space changes owner, group or
    mode."""
    assert world.ctx("shared", "create", "proj").rc == 0
    data = world.storage / "shared" / "proj" / "data"
    os.chown(data, unprivileged_user.uid, -1)
    data.chmod(0o2750)
    space = data.parent
    before = modes(space)

    run = world.ctx("shared", "create", "proj", "--group", str(unprivileged_user.gid), "--json")
    error = refused_json(run, "EPERM", 1)
    assert error["message"].startswith(
        f"{data} belongs to uid {unprivileged_user.uid}, not to uid 0, who made the rest: "
        f"its group 0 and mode 2750 should be {unprivileged_user.gid} and 2770"
    ), run
    assert f"'chown 0 {data}'" in error["message"] and "nothing was changed" in error["message"]
    assert modes(space) == before


# --------------------------------------------------------------------- agents (A-1..A-3)


@needs_root
def test_an_unknown_uid_for_user_needs_a_gid_and_makes_no_agent(world):
    """docs/tools.md: ``--user`` is a name or a uid, its groups from the user database; a uid
    the database does not know has no primary group to take: EINVAL, exit 2, saying to give
    ``--gid`` too, and no agent is made.  With ``--gid`` the agent is made with exactly those
    ids and no supplementary group."""
    uid = unused_id()
    request = json.dumps({"name": "numbered", "label": "numbered_t"})
    before = snapshot(world.storage / "agent")
    run = world.ctx("agent", "create", "-", "--user", str(uid), "--json", input=request)
    error = refused_json(run, "EINVAL", 2)
    assert error["message"] == f"uid {uid} is not a known user; give --gid too", run
    assert snapshot(world.storage / "agent") == before

    made = world.ctx(
        "agent", "create", "-", "--user", str(uid), "--gid", str(uid), "--json", input=request
    )
    assert made.rc == 0, made
    assert made.json()["identity"] == {"uid": uid, "gid": uid, "groups": []}, made
    assert json.loads(world.control("identity").read_text())["uid"] == NOBODY  # coder's kept


def nothing_running_for(storage: Path) -> bool:
    """No terminal directory of this storage root under /run, and no process naming it."""
    return not (RUN_BASE / root_key(storage)).exists() and processes_of(storage) == []


@needs_root
def test_both_workspace_options_are_a_usage_error_for_start_and_ctxterm(world):
    """``ctx agent start`` help: ``--workspace DIR`` mounts DIR, ``--no-workspace`` nothing;
    both at once is a malformed command line (EINVAL, exit 2), for ``bin/ctxterm`` too
    (``ctxterm: EINVAL``): no terminal, no ``/run`` entry, no session directory is made."""
    before = snapshot(world.storage)
    ws = world.top
    start = world.ctx("agent", "start", "coder", "--workspace", ws, "--no-workspace", "--json")
    assert refused_json(start, "EINVAL", 2)["message"] == (
        "give --workspace DIR or --no-workspace, not both"
    )
    term = subprocess.run(
        [str(world.storage / "bin" / "ctxterm"), "coder", "--workspace", str(ws), "--no-workspace"],
        capture_output=True,
        env=world.env,
        timeout=60,
    )
    assert term.returncode == 2, term
    assert term.stderr.decode().startswith("ctxterm: EINVAL: give --workspace DIR or --no-"), term
    assert snapshot(world.storage) == before
    assert nothing_running_for(world.storage)


@needs_root
def test_ctxterm_names_an_agent_that_is_not_and_an_illegal_session(world):
    """``bin/ctxterm`` refuses as ``ctx`` does, in its own name: an agent that does not exist
    is ENOENT (exit 1) naming how to list and create agents, an illegal session name is
    EINVAL (exit 2); nothing is started or made."""
    before = snapshot(world.storage)
    program = str(world.storage / "bin" / "ctxterm")

    def ctxterm(*args: str) -> Run:
        done = subprocess.run([program, *args], capture_output=True, env=world.env, timeout=60)
        return Run(list(args), done.returncode, done.stdout.decode(), done.stderr.decode())

    ghost = ctxterm("ghost", "--no-workspace")
    refused(ghost, "ENOENT", 1, prog="ctxterm")
    assert "there is no agent 'ghost'" in ghost.err and "'ctx agent list'" in ghost.err, ghost
    bad = ctxterm("coder", "--session", "two words", "--no-workspace")
    refused(bad, "EINVAL", 2, prog="ctxterm")
    assert "illegal session name: 'two words'" in bad.err, bad
    assert snapshot(world.storage) == before
    assert nothing_running_for(world.storage)


@needs_root
def test_a_start_of_an_agent_whose_identity_is_damaged_makes_nothing(world):
    """A-1, docs/policy.md: a damaged identity is named; ``ctx agent start`` is refused with
    EACCES (exit 1) naming the file before anything is made: no home or session directory,
    no ``/run`` entry, no ``terminal.started`` in the agent's log."""
    world.control("identity").write_text('{"uid": 65534, "gid": 65534}\n')
    before = snapshot(world.storage)
    run = world.ctx("agent", "start", "coder", "--session", "s1", "--no-workspace", "--json")
    error = refused_json(run, "EACCES", 1)
    assert error["message"] == (
        'agent/coder.d/identity is invalid: expected exactly {"uid": N, "gid": N, '
        '"groups": [N, ...]}'
    ), run
    assert snapshot(world.storage) == before
    assert nothing_running_for(world.storage)
    types = [event["type"] for event in read_jsonl(world.control("log"))]
    assert "terminal.started" not in types, types


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    with coder_host(_template, TOP, ["fs.read"], {"notes.txt": "a note\n"}) as made:
        yield made


@needs_terminal
def test_a_terminal_whose_identity_is_damaged_meanwhile_is_still_stopped(host):
    """A-1, A-2: the identity of an agent whose terminal runs is damaged by hand.  ``ctx agent
    watch`` then refuses with EACCES (exit 1) naming the file, and the terminal still runs;
    ``ctx agent stop`` still ends it, found by the agent's name, with a warning naming the
    file, and leaves nothing of it."""
    term = host.start()
    pid = int((term.rundir / "pid").read_text())
    identity = host.storage / "agent" / "coder.d" / "identity"
    good = identity.read_bytes()
    identity.write_text('{"uid": 65534, "gid": 65534, "groups": "65534"}\n')
    said = "agent/coder.d/identity is invalid: groups must be a list of group ids"
    try:
        watch = host.ctx("agent", "watch", "coder", "--session", term.session)
        refused(watch, "EACCES", 1)
        assert said in watch.err, watch
        assert (
            alive(pid)
            and term.listening_at.exists()
            and os.path.ismount(term.rundir / "private" / "ctx")
        )
        stop = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
        assert stop.rc == 0 and json.loads(stop.out)["pid"] == pid, stop
        assert said in stop.err and "ctx: warning: " in stop.err, stop
    finally:
        identity.write_bytes(good)
    assert wait_for(lambda: not alive(pid), 15)
    assert not term.rundir.exists() and not term.link.exists()


# ------------------------------------------------------------------ ctxmcp (M-1..M-3)

# A stdio MCP server that answers initialize as the argument says, then tools/list so.
LISTING_SERVER = (
    WIRE
    + r"""
mode = sys.argv[1]
first = receive()
if mode == "initialize-refused":
    send({"jsonrpc": "2.0", "id": first["id"], "error": {"code": -32602, "message": "go away"}})
    receive()
    sys.exit(0)
send({"jsonrpc": "2.0", "id": first["id"], "result": {"protocolVersion": "2025-06-18",
      "capabilities": {"tools": {}}, "serverInfo": {"name": "odd", "version": "0"}}})
receive()  # notifications/initialized
ask = receive()
tool = {"name": "echo", "description": "d", "inputSchema": {"type": "object"}}
answers = {
    "no-tools": {"result": {"items": [tool]}},
    "cursor-twice": {"result": {"tools": [tool], "nextCursor": "same"}},
    "cursor-an-object": {"result": {"tools": [tool], "nextCursor": {"page": 2}}},
    "error-object": {"error": {"code": -32000, "message": "listing is down"}},
    "error-a-string": {"error": "listing is down"},
}
while True:
    if mode == "not-json-rpc":
        send_bytes(b'{"id": %d, "result": {"tools": []}}\n' % ask["id"])
    else:
        send({"jsonrpc": "2.0", "id": ask["id"], **answers[mode]})
    ask = receive()
"""
)

LISTING_BREAKS = {
    "initialize-refused": ("EREMOTEIO", "server 's' refused initialize: go away (code -32602)"),
    "no-tools": ("EPROTO", "broke the protocol: its tools/list result has no 'tools' list"),
    "cursor-twice": ("EPROTO", "broke the protocol: its tools/list gave the cursor 'same' twice"),
    "cursor-an-object": ("EPROTO", "its tools/list nextCursor "),
    "error-object": ("EREMOTEIO", "server 's' refused tools/list: listing is down (code -32000)"),
    "error-a-string": (
        "EPROTO",
        'its error answer to tools/list is "listing is down", not an object',
    ),
    "not-json-rpc": ("EPROTO", "broke the protocol: it wrote a line that is not JSON-RPC 2.0"),
}


def ctxmcp(*args, cwd: Path | None = None, timeout: float = 60) -> Run:
    done = subprocess.run(
        [str(CTXMCP), *map(str, args)],
        input=b"",
        capture_output=True,
        env=clean_env(),
        cwd=cwd,
        timeout=timeout,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


@pytest.fixture
def mcp_dir() -> Iterator[Path]:
    top = new_scratch_dir(TOP, "mcp")
    (top / "server.py").write_text(LISTING_SERVER)
    try:
        yield top
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed")
@pytest.mark.parametrize("mode", sorted(LISTING_BREAKS))
def test_a_server_that_breaks_its_listing_ends_ctxmcp_with_its_errno_and_writes_nothing(
    mcp_dir, mode
):
    """docs/tools.md, *A misbehaving server* and *Exit statuses*: a server that refuses a
    request, answers it with something that is no answer, or hands out the same cursor twice
    ends the session with its errno (EREMOTEIO for its refusal, EPROTO for a broken
    protocol), exit 1, for ``list`` and ``project`` alike, the error object on stdout with
    --json, nothing written: OUT is not made, and no process of the server is left."""
    config = mcp_dir / "mcp.json"
    entry = {"command": PYTHON, "args": [str(mcp_dir / "server.py"), mode]}
    config.write_text(json.dumps({"mcpServers": {"s": entry}}))
    errno_name, says = LISTING_BREAKS[mode]
    out = mcp_dir / "out"

    listed = ctxmcp("list", "--config", config, "--server", "s", "--timeout", "10")
    refused(listed, errno_name, 1, prog="ctxmcp")
    assert says in listed.err and listed.out == "", listed
    projected = ctxmcp(
        "project", "--config", config, "--server", "s", "--runtime-config", "/mcp/mcp.json",
        "--out", out, "--timeout", "10", "--json",
    )  # fmt: skip
    error = refused_json(projected, errno_name, 1, prog="ctxmcp")
    assert says in error["message"], projected
    assert not out.exists()
    assert wait_for(lambda: processes_of(mcp_dir) == [], 5), processes_of(mcp_dir)


CONFIG_ENTRIES = {
    "an entry that is a list": (["/bin/true"], "server 's' is not an object"),
    "a type other than stdio": (
        {"type": "sse", "command": "/bin/true"},
        "is not a stdio server; ctxmcp projects stdio servers only (M-1)",
    ),
    "args that are one string": (
        {"command": "/bin/true", "args": "--serve"},
        "'args' must be a list of strings",
    ),
    "env that is a list": ({"command": "/bin/true", "env": ["A=1"]}, "'env' must map names"),
    "an empty env name": (
        {"command": "/bin/true", "env": {"": "x"}},
        "'env' name '' cannot be set: it is empty or holds '='",
    ),
    "a cwd that is a number": ({"command": "/bin/true", "cwd": 7}, "'cwd' must be a string"),
    "a command that is a number": ({"command": 7}, "'command' must be a non-empty string"),
}


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed")
@pytest.mark.parametrize("case", sorted(CONFIG_ENTRIES))
def test_a_server_entry_of_the_wrong_shape_is_a_usage_error_before_anything_starts(mcp_dir, case):
    """docs/tools.md: a configuration maps names to ``{"command", "args", "env", "cwd"}``, an
    entry of another ``type`` is refused (M-1), and "2 a configuration or server name that
    cannot be used": EINVAL, exit 2, naming the server and the field, before the server
    starts and before OUT is made."""
    entry, says = CONFIG_ENTRIES[case]
    config = mcp_dir / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"s": entry, "other": {"command": "/bin/true"}}}))
    out = mcp_dir / "out"
    run = ctxmcp(
        "project", "--config", config, "--server", "s", "--runtime-config", "/mcp/mcp.json",
        "--out", out, "--json",
    )  # fmt: skip
    error = refused_json(run, "EINVAL", 2, prog="ctxmcp")
    assert error["message"].startswith(f"{config}: server 's'") and says in error["message"], run
    assert not out.exists()
    assert processes_of(mcp_dir) == []


@needs_root
@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed")
def test_a_configuration_the_caller_may_not_read_is_eacces_wherever_the_refusal_lies(
    mcp_dir, unprivileged_user
):
    """docs/tools.md: "2 a configuration or server name that cannot be used", each "named
    with its errno".  A configuration the test user may not read is refused before any
    server starts, exit 2, naming the file with the kernel's errno, EACCES: whether the
    file's own mode or its directory's keeps the user out."""
    entry = {"command": PYTHON, "args": [str(mcp_dir / "server.py"), "no-tools"]}
    text = json.dumps({"mcpServers": {"s": entry}})
    closed = mcp_dir / "closed"
    closed.mkdir(mode=0o700)
    behind = closed / "mcp.json"
    behind.write_text(text)
    behind.chmod(0o644)
    private = mcp_dir / "private.json"
    private.write_text(text)
    private.chmod(0o600)
    for config in (behind, private):
        run = as_user(
            unprivileged_user, "list", "--config", config, "--server", "s", "--json",
            storage=None, program=CTXMCP,
        )  # fmt: skip
        error = refused_json(run, "EACCES", 2, prog="ctxmcp")
        assert str(config) in error["message"], run
    assert processes_of(mcp_dir) == []
