"""Five agents and one mounted ``/ctx`` (SPEC §13 F-1, §8 A-3, §4 S-1/S-5/S-6, §9 X-1, T-5,
P-5/P-6), used at the same time through the mount and through the ``ctx`` command.

The agents, all made with ``ctx agent create`` by root:

* ``ana``: uid A, member of the space's group; ``fs.read``, ``fs.list``, ``fs.write``;
  ``shared:proj read write``;
* ``bob``: uid B, member of the space's group; ``fs.read``, ``fs.list``; ``shared:proj read``;
* ``cai``: uid A as well (it shares ana's home, R-4); ``fs.list``, ``fs.write``;
  ``shared:proj read write``;
* ``dee``: uid C, *not* a member of the space's group; ``fs.list``, ``fs.write``; its policy
  grants ``shared:proj read write``, which the mode bits (step 2 of P-5) take back;
* ``eve``: root's default user ``nobody``; no grant at all.

What is checked: each agent's tools see exactly their view (T-5, docs/mount.md "What each
view shows": its own home, its own agent entry, the spaces it may read, the tools it may run);
its calls are recorded in its own sessions (S-1, S-2, S-5) with the owners and modes
docs/sessions.md gives, concurrent calls of five agents losing and mixing no event; the host
mount serves every uid by the mode bits, what a uid makes through it is that uid's, with the
caller's umask and the space's group (docs/mount.md "Ownership"); another agent's home and
sessions are refused with the documented errno in each place (``EACCES`` from the kernel's
mode bits on the host mount and from the tools, ``ENOENT`` in an agent's view, ``EACCES`` from
``ctx session`` run as another uid); and agents created, changed and removed while the mount
is up are shown as docs/mount.md says (a policy change within a second, a removed agent's
view empty with a warning, back with a note once it is made again)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Mount,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    serving,
    wait_for,
    write_durably,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, members_of, run_as, users_named

SCRATCH = scratch_top(__file__)
SPACE = "proj"
GROUP = "ctxmam-g"
MEMBER_A, MEMBER_B, OUTSIDER = "ctxmam-a", "ctxmam-b", "ctxmam-c"
CORE = ("fs.read", "fs.list", "fs.write")
# docs/mount.md: a view keeps an answer half a second, the kernel half a second more.
SETTLE = 10.0

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root


# ------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class Agent:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    tools: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.name}_t"


@dataclass
class World:
    """A storage root with space ``proj`` (group ``ctxmam-g``), the five agents, and the
    host's view of it mounted at ``top/view`` (every uid may reach ``top``)."""

    top: Path
    storage: Path
    mount: Mount
    agents: dict[str, Agent]
    users: dict[str, UnprivilegedUser]
    space_gid: int

    @property
    def view(self) -> Path:
        return self.mount.where

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def call(
        self, agent: str, tool: str, data: dict, *, project: str = "", session: str = ""
    ) -> dict:
        """``ctx run --agent AGENT --native TOOL`` with ``data``: its ``result`` frame."""
        args = ["run", "--agent", agent, "--native"]
        if project:
            args += ["--project", project]
        if session:
            args += ["--session", session]
        done = self.ctx(*args, tool, input=json.dumps(data))
        frames = [json.loads(line) for line in done.out.splitlines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", done
        return frames[-1]

    def home(self, agent: str) -> Path:
        return self.storage / "home" / str(self.agents[agent].uid)

    def session_dir(self, agent: str, session: str = "default", project: str = "") -> Path:
        if project:
            base = self.storage / "shared" / project / "agent" / agent
        else:
            base = self.home(agent) / "agent" / agent
        return base / "session" / session

    def user_of(self, agent: str) -> UnprivilegedUser:
        return next(u for u in self.users.values() if u.uid == self.agents[agent].uid)

    def policy(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d" / "policy"

    def edit_policy(self, agent: str, add: list[str] = (), drop: list[str] = ()) -> None:
        """The administrator's edit of an agent's policy: a new file renamed into place."""
        path = self.policy(agent)
        rules = [line for line in path.read_text().splitlines() if line not in drop]
        rules += list(add)
        write_durably(path.parent, "policy", ("\n".join(rules) + "\n").encode())
        path.chmod(0o644)


def create_agent(storage: Path, request: dict, *options: str) -> dict:
    made = ctx_run(
        "agent", "create", "--storage", storage, "--json", *options, "-",
        input=json.dumps(request),
    )  # fmt: skip
    assert made.rc == 0, made
    return made.json()


def make_agents(storage: Path, users: dict[str, UnprivilegedUser]) -> dict[str, Agent]:
    plans = [
        ("ana", MEMBER_A, ["fs.read", "fs.list", "fs.write"], {SPACE: ["read", "write"]}),
        ("bob", MEMBER_B, ["fs.read", "fs.list"], {SPACE: ["read"]}),
        ("cai", MEMBER_A, ["fs.list", "fs.write"], {SPACE: "read write"}),
        ("dee", OUTSIDER, ["fs.list", "fs.write"], {SPACE: ["read", "write"]}),
        ("eve", None, [], {}),
    ]

    def create(name: str, user: str | None, tools: list[str], shared: dict) -> Agent:
        request = {"name": name, "label": f"{name}_t", "tools": tools, "shared": shared}
        options = ("--user", user) if user else ()
        ident = create_agent(storage, request, *options)["identity"]
        return Agent(name, ident["uid"], ident["gid"], tuple(ident["groups"]), tuple(tools))

    # Created at the same time: creates of one tier take turns (docs/tools.md).
    made = in_parallel([(lambda plan=plan: create(*plan)) for plan in plans])
    agents = {agent.name: agent for agent in made}
    # The tools' own half of P-6 (the host's to give): every label, so that the agent's
    # policy alone decides who runs what.
    for tool in CORE:
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            for name in agents:
                policy.write(f"allow {name}_t tool:{tool} execute\n")
    return agents


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    (a, b), gid = members_of(GROUP, MEMBER_A, MEMBER_B)
    (c,) = users_named(OUTSIDER)
    users = {MEMBER_A: a, MEMBER_B: b, OUTSIDER: c}
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    made = ctx_run("shared", "create", SPACE, "--group", GROUP, "--storage", storage)
    assert made.rc == 0, made
    agents = make_agents(storage, users)
    where = top / "view"
    where.mkdir(mode=0o755)
    try:
        with serving(storage, where) as mount:
            yield World(top, storage, mount, agents, users, gid)
            assert "Traceback" not in mount.said(), mount.said()
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def agent_view(w: World, agent: str) -> Iterator[Mount]:
    """``ctx mount --as AGENT`` beside the host's mount, until the block ends."""
    where = w.top / f"view-{agent}"
    where.mkdir(mode=0o755)
    with serving(w.storage, where, "--as", agent) as mount:
        yield mount
    assert not mounted_at(where)


# A program run as one uid: a JSON list of operations in argv[1], one JSON answer per
# operation on stdout ({"ok": ...} or {"err": "ERRNO"}); what ordinary programs meet.
PROBE = r"""
import errno, json, os, sys
answers = []
for op in json.loads(sys.argv[1]):
    kind, path = op[0], op[1]
    try:
        if kind == "list":
            answers.append({"ok": sorted(os.listdir(path))})
        elif kind == "read":
            with open(path, "rb") as f:
                answers.append({"ok": len(f.read())})
        elif kind == "write":
            os.umask(op[2])
            with open(path, "w") as f:
                f.write(op[3])
                f.flush()
                os.fsync(f.fileno())
            answers.append({"ok": True})
        elif kind == "mkdir":
            os.umask(op[2])
            os.mkdir(path, 0o777)
            answers.append({"ok": True})
        elif kind == "rename":
            os.rename(path, op[2])
            answers.append({"ok": True})
        elif kind == "append":
            with open(path, "a") as f:
                f.write(op[2])
            answers.append({"ok": True})
    except OSError as exc:
        answers.append({"err": errno.errorcode.get(exc.errno, str(exc.errno))})
print(json.dumps(answers))
"""


def probe(user: UnprivilegedUser | None, ops: list[list]) -> list[dict]:
    """``ops`` made by a process of ``user`` (with its groups; None: a root process)."""
    argv = [sys.executable, "-I", "-c", PROBE, json.dumps(ops, default=str)]
    if user is None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    else:
        done = run_as(user, argv, user.groups, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def probe_nobody(ops: list[list]) -> list[dict]:
    nobody = pwd.getpwnam("nobody")
    user = UnprivilegedUser("nobody", nobody.pw_uid, nobody.pw_gid)
    return probe(user, ops)


def listed(frame: dict) -> set[str]:
    """The names of an ``fs.list`` result frame that succeeded."""
    assert frame["status"] == "ok", frame
    return {entry["name"] for entry in frame["output"]["entries"]}


def in_parallel(jobs: list, workers: int = 6) -> list:
    """Each callable of ``jobs`` run at the same time as the others; their answers."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [f.result() for f in [pool.submit(job) for job in jobs]]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def owner_of(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


# ------------------------------------------------------------- views through the tools


def test_five_agents_at_once_each_see_exactly_their_slice_and_record_at_home(world: World):
    """T-5, F-1, A-3, S-1, S-5: twenty concurrent ``fs.list`` calls, four per agent (two
    agents of one uid); each agent's tools see its own home and agent entry only, the spaces
    its policy and mode bits let it read, the tools it may run; the agent without a grant is
    refused at step 5 (P-6); every call, refused or not, is recorded in the caller's own home
    session."""
    w = world
    places = ["/ctx/home", "/ctx/agent", "/ctx/shared", "/ctx/tool"]
    jobs = [
        (lambda a=a, p=p: (a, p, w.call(a, "fs.list", {"path": p})))
        for a in w.agents
        for p in places
    ]
    seen: dict[tuple[str, str], dict] = {(a, p): f for a, p, f in in_parallel(jobs)}

    def tools_of(agent: str) -> set[str]:
        names = set(w.agents[agent].tools)
        return names | {f"{t}.d" for t in names} | {"tsh.d"}

    docs = "cortexfs-docs"
    for agent in ("ana", "bob", "cai", "dee"):
        a = w.agents[agent]
        assert listed(seen[agent, "/ctx/home"]) == {str(a.uid)}, agent
        assert listed(seen[agent, "/ctx/agent"]) == {agent, f"{agent}.d"}, agent
        assert listed(seen[agent, "/ctx/tool"]) == tools_of(agent), agent
    for agent in ("ana", "bob", "cai"):
        assert listed(seen[agent, "/ctx/shared"]) == {docs, SPACE}, agent
    # dee's policy grants the space, its uid is outside the space's group: X-1 counts the
    # directory's permissions.
    assert listed(seen["dee", "/ctx/shared"]) == {docs}
    for place in places:
        frame = seen["eve", place]
        assert frame["status"] == "error", frame
        assert frame["error"]["error"] == "EACCES" and frame["error"]["step"] == 5, frame
        assert frame["exit_status"] is None, frame  # refused before anything ran
    check_home_sessions(w, len(places))


def check_home_sessions(w: World, calls: int) -> None:
    """S-1, S-2, S-5, R-4: each agent's ``calls`` calls are in its own
    ``home/<uid>/agent/<agent>/session/default``, every ``tool_call`` with its
    ``tool_result``, no event of another agent in it; directories 0700 and events 0600 of the
    agent's uid and gid; ``home/<uid>`` 0755 holds the agents of that uid only."""
    for agent, a in w.agents.items():
        session = w.session_dir(agent)
        events = read_jsonl(session / "events.jsonl")
        assert len(events) == 2 * calls, (agent, events)
        assert {e["agent"] for e in events} == {agent}
        assert {e["session"] for e in events} == {"default"}
        by_call: dict[str, list[str]] = {}
        for event in events:
            by_call.setdefault(event["call"], []).append(event["type"])
        assert sorted(by_call.values()) == [["tool_call", "tool_result"]] * calls, events
        # Owners and modes, docs/sessions.md "Where sessions live".
        assert owner_of(session / "events.jsonl") == (a.uid, a.gid), agent
        assert mode_of(session / "events.jsonl") == 0o600, agent
        for d in (session, session.parent, session.parent.parent, w.home(agent) / "agent"):
            assert owner_of(d) == (a.uid, a.gid) and mode_of(d) == 0o700, d
        assert owner_of(w.home(agent)) == (a.uid, a.gid) and mode_of(w.home(agent)) == 0o755
    by_uid: dict[int, set[str]] = {}
    for agent, a in w.agents.items():
        by_uid.setdefault(a.uid, set()).add(agent)
    homes = {int(p.name) for p in (w.storage / "home").iterdir()}
    assert homes == set(by_uid)
    for uid, names in by_uid.items():
        assert set(os.listdir(w.storage / "home" / str(uid) / "agent")) == names, uid


# ----------------------------------------------------------------- the one host mount


def test_host_mount_serves_every_uid_by_its_mode_bits_reading_and_writing(world: World):
    """docs/mount.md: run as root the host's view serves every uid and the kernel checks each
    caller's mode bits; home sessions are nobody else's to read (docs/sessions.md): another
    uid's ``home/<uid>/agent`` and session are ``EACCES``, its own are readable (two agents
    of one uid share what the uid may read); what each uid then writes through the mount is
    its own, and the tools and the mount see each other's files (below)."""
    w = world
    in_parallel([(lambda a=a: w.call(a, "fs.list", {"path": "/ctx"})) for a in w.agents])
    v = w.view

    def ops_for(agent: str) -> list[list]:
        return [
            ["list", v / "home" / str(w.agents[other].uid) / "agent"]
            for other in ("ana", "bob", "dee", "eve")
        ] + [
            ["read", v / w.session_dir(other).relative_to(w.storage) / "events.jsonl"]
            for other in ("ana", "bob", "cai", "dee", "eve")
        ]

    probes = {
        "ana": lambda: probe(w.user_of("ana"), ops_for("ana")),
        "bob": lambda: probe(w.user_of("bob"), ops_for("bob")),
        "dee": lambda: probe(w.user_of("dee"), ops_for("dee")),
        "eve": lambda: probe_nobody(ops_for("eve")),
    }
    answers = dict(zip(probes, in_parallel(list(probes.values())), strict=True))
    others = ("ana", "bob", "dee", "eve")
    sessions = ("ana", "bob", "cai", "dee", "eve")
    for caller, got in answers.items():
        uid = w.agents[caller].uid
        for i, other in enumerate(others):
            own = w.agents[other].uid == uid
            if own:
                assert "ok" in got[i], (caller, other, got[i])
            else:
                assert got[i] == {"err": "EACCES"}, (caller, other, got[i])
        for i, other in enumerate(sessions, start=len(others)):
            own = w.agents[other].uid == uid
            assert ("ok" in got[i]) if own else got[i] == {"err": "EACCES"}, (caller, other)
    # The home listing as ana's uid names both agents of that uid.
    assert answers["ana"][0] == {"ok": ["ana", "cai"]}
    check_writes_through_the_mount(w)
    check_tools_and_mount_agree(w)


def check_writes_through_the_mount(w: World) -> None:
    """docs/mount.md "Ownership" and umask: what each uid makes through the mount is its own,
    mode 0666/0777 less the caller's umask; in the space (setgid, X-1) the space's group; a
    uid outside the group or writing another's home is refused ``EACCES`` and nothing is
    made."""
    v = w.view
    data = v / "shared" / SPACE / "data"

    def writer(agent: str, umask: int):
        home = v / "home" / str(w.agents[agent].uid)
        other = v / "home" / str(w.agents["bob" if agent != "bob" else "ana"].uid)
        ops = [
            ["write", home / f"{agent}.txt", umask, agent],
            ["mkdir", home / f"{agent}.dir", umask],
            ["write", data / f"{agent}.txt", umask, agent],
            ["write", other / f"{agent}-was-here.txt", umask, agent],
        ]
        if agent == "eve":
            return probe_nobody(ops)
        return probe(w.user_of(agent), ops)

    umasks = {"ana": 0o022, "bob": 0o027, "dee": 0o077, "eve": 0o002}
    # The agents' tools write at the same time, through the CLI.
    tools = [
        (lambda a=a: w.call(a, "fs.write", {"path": f"/ctx/home/{w.agents[a].uid}/t-{a}",
                                             "content": a}))
        for a in ("ana", "cai", "dee")
    ]  # fmt: skip
    writers = [(lambda a=a, m=m: writer(a, m)) for a, m in umasks.items()]
    answers = in_parallel(writers + tools)
    results = dict(zip(umasks, answers[: len(writers)], strict=True))
    for frame in answers[len(writers) :]:
        assert frame["status"] == "ok", frame
        a = w.agents[frame["agent"]]
        made = w.storage / "home" / str(a.uid) / f"t-{frame['agent']}"
        assert made.read_text() == frame["agent"] and owner_of(made) == (a.uid, a.gid)
    s = w.storage
    for agent, umask in umasks.items():
        a = w.agents[agent]
        got = results[agent]
        assert got[0] == {"ok": True} and got[1] == {"ok": True}, (agent, got)
        home = s / "home" / str(a.uid)
        assert owner_of(home / f"{agent}.txt") == (a.uid, a.gid), agent
        assert mode_of(home / f"{agent}.txt") == 0o666 & ~umask, agent
        assert mode_of(home / f"{agent}.dir") == 0o777 & ~umask, agent
        assert got[3] == {"err": "EACCES"}, (agent, got)
        other = "bob" if agent != "bob" else "ana"
        assert not (s / "home" / str(w.agents[other].uid) / f"{agent}-was-here.txt").exists()
    for member in ("ana", "bob"):
        a = w.agents[member]
        assert results[member][2] == {"ok": True}, results[member]
        made = s / "shared" / SPACE / "data" / f"{member}.txt"
        assert owner_of(made) == (a.uid, w.space_gid), member
        assert made.read_text() == member
    for outsider in ("dee", "eve"):
        assert results[outsider][2] == {"err": "EACCES"}, results[outsider]
        assert not (s / "shared" / SPACE / "data" / f"{outsider}.txt").exists()


def check_tools_and_mount_agree(w: World) -> None:
    """F-1, X-1: a file an agent's tool writes in the space is read at once through the host
    mount by another member's uid, and one a member writes through the mount is read by
    another agent's tool; the tool's file is the agent's uid with the space's group."""
    v = w.view
    wrote = w.call(
        "ana", "fs.write", {"path": f"/ctx/shared/{SPACE}/data/from-ana", "content": "a"}
    )
    assert wrote["status"] == "ok", wrote
    got = probe(w.user_of("bob"), [
        ["read", v / "shared" / SPACE / "data" / "from-ana"],
        ["write", v / "shared" / SPACE / "data" / "from-bob", 0o002, "bob!"],
    ])  # fmt: skip
    assert got == [{"ok": 1}, {"ok": True}], got
    made = w.storage / "shared" / SPACE / "data" / "from-ana"
    assert owner_of(made) == (w.agents["ana"].uid, w.space_gid)
    read = w.call("cai", "fs.list", {"path": f"/ctx/shared/{SPACE}/data"})
    assert listed(read) >= {"from-ana", "from-bob"}
    back = w.call("ana", "fs.read", {"path": f"/ctx/shared/{SPACE}/data/from-bob"})
    assert back["status"] == "ok" and back["output"]["content"] == "bob!", back
    # bob may read the space, not write it: step 3 refuses its write (docs/policy.md).
    refused = w.call("bob", "fs.list", {"path": "/ctx"}, project=SPACE)
    assert refused["status"] == "error" and refused["error"]["error"] == "EACCES", refused
    assert refused["error"]["step"] == 3, refused
    assert not (w.storage / "shared" / SPACE / "agent" / "bob").exists()


# --------------------------------------------------------------------- shared sessions


def test_two_agents_record_in_one_space_at_once_and_the_others_are_refused(world: World):
    """S-1, S-5, S-6, X-1: ana and cai (one uid) record in ``shared/proj`` at the same time,
    each in its own directory, owned by the uid with the space's group, 03770 and events
    0660; bob (read only) is refused at step 3, dee (outside the group) at step 2, eve (not a
    member either) at step 2: nothing is made for them under ``shared/proj/agent/``."""
    w = world
    calls = 3
    writers = [
        (lambda a=a: w.call(a, "fs.list", {"path": "/ctx/home"}, project=SPACE, session="sync"))
        for a in ("ana", "cai")
        for _ in range(calls)
    ]
    refused = [
        (lambda a=a: w.call(a, "fs.list", {"path": "/ctx/home"}, project=SPACE, session="sync"))
        for a in ("bob", "dee", "eve")
    ]
    frames = in_parallel(writers + refused)
    assert all(f["status"] == "ok" for f in frames[: len(writers)]), frames
    steps = {f["agent"]: (f["error"]["error"], f["error"]["step"]) for f in frames[len(writers) :]}
    assert steps == {"bob": ("EACCES", 3), "dee": ("EACCES", 2), "eve": ("EACCES", 2)}, steps
    agent_dir = w.storage / "shared" / SPACE / "agent"
    assert set(os.listdir(agent_dir)) == {"ana", "cai"}
    for agent in ("ana", "cai"):
        a = w.agents[agent]
        session = w.session_dir(agent, "sync", SPACE)
        events = read_jsonl(session / "events.jsonl")
        assert len(events) == 2 * calls and {e["agent"] for e in events} == {agent}, events
        assert owner_of(session / "events.jsonl") == (a.uid, w.space_gid)
        assert mode_of(session / "events.jsonl") == 0o660
        for d in (session, session.parent, session.parent.parent):
            assert owner_of(d) == (a.uid, w.space_gid), d
            assert mode_of(d) == 0o3770, (d, oct(mode_of(d)))
        # Nothing recorded in the home for these calls.
        assert not w.session_dir(agent, "sync").exists()


# ------------------------------------------------------ another agent's home and sessions


def test_another_agents_home_and_sessions_are_refused_everywhere(world: World):
    """S-6, T-5, docs/mount.md: bob's tools meet ``EACCES`` for ana's home and ana's shared
    session; in bob's view (``ctx mount --as bob``) they do not exist (``ENOENT``) and ana's
    ``session/`` lists nothing; ``ctx session`` run as bob's uid reads bob's own sessions and
    refuses ana's home sessions with ``EACCES`` (exit 1); and cai, of ana's uid, is kept
    from ana's sessions in its own view (below)."""
    w = world
    ana_uid = w.agents["ana"].uid
    first = in_parallel([
        lambda: w.call("ana", "fs.write", {"path": f"/ctx/home/{ana_uid}/n", "content": "x"}),
        lambda: w.call("ana", "fs.list", {"path": "/ctx"}, project=SPACE, session="review"),
        lambda: w.call("bob", "fs.list", {"path": "/ctx"}),
        lambda: w.call("cai", "fs.list", {"path": "/ctx"}),
    ])  # fmt: skip
    assert [f["status"] for f in first] == ["ok"] * 4, first
    shared_events = f"/ctx/shared/{SPACE}/agent/ana/session/review/events.jsonl"
    asked = [
        ("fs.list", f"/ctx/home/{ana_uid}"),
        ("fs.read", f"/ctx/home/{ana_uid}/n"),
        ("fs.read", f"/ctx/home/{ana_uid}/agent/ana/session/default/events.jsonl"),
        ("fs.read", shared_events),
    ]
    frames = in_parallel([(lambda t=t, p=p: w.call("bob", t, {"path": p})) for t, p in asked])
    for (_, path), frame in zip(asked, frames, strict=True):
        assert frame["status"] == "error", (path, frame)
        assert frame["error"]["error"] == "EACCES", (path, frame)
        assert frame["output"]["errno"] == 13, (path, frame)
    assert (
        listed(w.call("bob", "fs.list", {"path": f"/ctx/shared/{SPACE}/agent/ana/session"}))
        == set()
    )

    bob = w.user_of("bob")
    with agent_view(w, "bob") as mine:
        v = mine.where
        got = probe(bob, [
            ["list", v / "home"],
            ["list", v / "home" / str(ana_uid)],
            ["read", v / "home" / str(ana_uid) / "n"],
            ["list", v / "shared" / SPACE / "agent" / "ana" / "session"],
            ["read", v / shared_events.removeprefix("/ctx/")],
            ["list", v / "agent"],
        ])  # fmt: skip
        assert got == [
            {"ok": [str(w.agents["bob"].uid)]},
            {"err": "ENOENT"},
            {"err": "ENOENT"},
            {"ok": []},
            {"err": "ENOENT"},
            {"ok": ["bob", "bob.d"]},
        ], got

    as_bob = {"CTX_STORAGE": str(w.storage), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    own = run_as(bob, [*CTX_ARGV, "session", "show", "bob", "--json"], bob.groups, env=as_bob)
    assert own.returncode == 0, own.stderr
    assert {json.loads(line)["agent"] for line in own.stdout.splitlines()} == {"bob"}
    for args in (["show", "ana"], ["list", "ana"], ["show", "cai", "--uid", str(ana_uid)]):
        theirs = run_as(bob, [*CTX_ARGV, "session", *args], bob.groups, env=as_bob)
        assert theirs.returncode == 1, (args, theirs.stdout, theirs.stderr)
        assert "EACCES" in theirs.stderr and theirs.stdout == "", (args, theirs.stderr)
        assert "Traceback" not in theirs.stderr
    check_one_uid_agents_apart(w)


def check_one_uid_agents_apart(w: World) -> None:
    """docs/mount.md: in the agent's home, the sessions of the other agents of its uid are
    kept as a space's are: cai's view lists ana's directory but none of ana's sessions
    without ``session:<n> read``, and cai's uid may not make, rename or remove them there
    (``EACCES``), while its own home session directory is as the home is."""
    uid = w.agents["ana"].uid
    with agent_view(w, "cai") as view:
        agents = view.where / "home" / str(uid) / "agent"
        got = probe(w.user_of("cai"), [
            ["list", agents],
            ["list", agents / "ana" / "session"],
            ["list", agents / "cai" / "session"],
            ["mkdir", agents / "ana" / "session" / "planted", 0o022],
            ["rename", agents / "ana", agents / "ana-moved"],
            ["mkdir", agents / "zed", 0o022],
            ["mkdir", agents / "cai" / "session" / "mine", 0o022],
        ])  # fmt: skip
        assert got == [
            {"ok": ["ana", "cai"]},
            {"ok": []},
            {"ok": ["default"]},
            {"err": "EACCES"},
            {"err": "EACCES"},
            {"err": "EACCES"},
            {"ok": True},
        ], got
    home = w.storage / "home" / str(uid) / "agent"
    assert set(os.listdir(home)) == {"ana", "cai"}
    assert set(os.listdir(home / "ana" / "session")) == {"default"}
    assert owner_of(home / "cai" / "session" / "mine") == (uid, w.agents["cai"].gid)


# --------------------------------------------------- agents changing while the mount is up


def test_agents_created_and_removed_while_mounted_show_in_the_host_view(world: World):
    """A-3, F-1: an agent created while the host's view is mounted is listed in its
    ``agent/`` and its first call makes its home, seen through the mount; an agent removed is
    gone from the listing, its calls are refused ``ENOENT`` and its sessions stay (they
    outlive their agent, docs/sessions.md)."""
    w = world
    listing = w.view / "agent"
    assert set(os.listdir(listing)) >= {"ana", "bob", "cai", "dee", "eve"}
    fay = create_agent(
        w.storage,
        {"name": "fay", "label": "fay_t", "tools": ["fs.list"], "shared": {SPACE: ["read"]}},
        "--user", OUTSIDER,
    )  # fmt: skip
    assert wait_for(lambda: {"fay", "fay.d"} <= set(os.listdir(listing)), SETTLE)
    with (w.storage / "tool" / "fs.list.d" / "policy").open("a") as policy:
        policy.write("allow fay_t tool:fs.list execute\n")
    first = w.call("fay", "fs.list", {"path": "/ctx/home"})
    assert listed(first) == {str(fay["identity"]["uid"])}
    # fay shares dee's uid: both are in that home, seen through the mount by that uid.
    assert w.call("dee", "fs.list", {"path": "/ctx"})["status"] == "ok"
    home = w.view / "home" / str(fay["identity"]["uid"]) / "agent"
    assert probe(w.users[OUTSIDER], [["list", home]]) == [{"ok": ["dee", "fay"]}]

    assert w.call("bob", "fs.list", {"path": "/ctx"})["status"] == "ok"
    shutil.rmtree(w.storage / "agent" / "bob.d")
    (w.storage / "agent" / "bob").unlink()
    assert wait_for(lambda: not {"bob", "bob.d"} & set(os.listdir(listing)), SETTLE)
    gone = w.call("bob", "fs.list", {"path": "/ctx"})
    assert gone["status"] == "error" and gone["error"]["error"] == "ENOENT", gone
    kept = w.ctx("session", "show", "bob", "--json")
    assert kept.rc == 0, kept
    assert {json.loads(line)["agent"] for line in kept.lines()} == {"bob"}
    listed_agents = w.ctx("agent", "list")
    assert listed_agents.rc == 0 and "bob" not in listed_agents.out.split(), listed_agents


def test_an_agents_view_follows_its_policy_removal_and_recreation(world: World):
    """docs/mount.md: in bob's view (mounted while the other agents work) a policy change
    shows within a second (``session:review read`` shows ana's shared session, still not
    writable: ``EACCES``; revoking ``shared:proj read`` hides the space, ``ENOENT``); the
    agent removed empties the view, with a warning on the mount's stderr, and made again
    under another uid the view shows that uid's home and not the old one, with a note, and
    serves the new uid, not the old one."""
    w = world
    assert (
        w.call("ana", "fs.list", {"path": "/ctx"}, project=SPACE, session="review")["status"]
        == "ok"
    )
    bob = w.user_of("bob")
    sessions_of_ana = Path("shared") / SPACE / "agent" / "ana" / "session"
    with agent_view(w, "bob") as mine:
        v = mine.where
        assert probe(bob, [["list", v / sessions_of_ana]]) == [{"ok": []}]
        w.edit_policy("bob", add=["allow bob_t session:review read"])
        assert wait_for(
            lambda: probe(bob, [["list", v / sessions_of_ana]]) == [{"ok": ["review"]}], SETTLE
        )
        got = probe(bob, [
            ["read", v / sessions_of_ana / "review" / "events.jsonl"],
            ["append", v / sessions_of_ana / "review" / "events.jsonl", "{}\n"],
            ["write", v / sessions_of_ana / "review" / "planted", 0o022, "x"],
        ])  # fmt: skip
        assert "ok" in got[0] and got[1:] == [{"err": "EACCES"}, {"err": "EACCES"}], got
        # The tools see the same (T-5: one set of rules).
        assert listed(w.call("bob", "fs.list", {"path": f"/ctx/{sessions_of_ana}"})) == {"review"}

        w.edit_policy("bob", drop=[f"allow bob_t shared:{SPACE} read"])
        assert wait_for(
            lambda: probe(bob, [["list", v / "shared" / SPACE]]) == [{"err": "ENOENT"}], SETTLE
        )
        assert listed(w.call("bob", "fs.list", {"path": "/ctx/shared"})) == {"cortexfs-docs"}

        shutil.rmtree(w.storage / "agent" / "bob.d")
        (w.storage / "agent" / "bob").unlink()
        assert wait_for(lambda: probe(bob, [["list", v]]) == [{"ok": []}], SETTLE)
        assert wait_for(lambda: "bob's view is empty" in mine.said(), SETTLE), mine.said()
        outsider = w.users[OUTSIDER]
        create_agent(
            w.storage,
            {"name": "bob", "label": "bob_t", "tools": ["fs.list"], "shared": {SPACE: "read"}},
            "--user", OUTSIDER,
        )  # fmt: skip
        assert w.call("dee", "fs.list", {"path": "/ctx"})["status"] == "ok"  # home of that uid
        assert wait_for(
            lambda: probe(None, [["list", v / "home"]]) == [{"ok": [str(outsider.uid)]}], SETTLE
        )
        assert wait_for(lambda: "view shows its entries again" in mine.said(), SETTLE)
        old_home = v / "home" / str(bob.uid)
        assert probe(None, [["list", old_home]]) == [{"err": "ENOENT"}]
        # The old uid is no longer the view's own (P-5 step 1): refused before any name.
        assert probe(bob, [["list", v / "agent"]]) == [{"err": "EACCES"}]
        assert probe(outsider, [["list", v / "agent"]]) == [{"ok": ["bob", "bob.d"]}]
        # The new bob is outside the space's group: the space is not in its view.
        assert probe(outsider, [["list", v / "shared"]]) == [{"ok": ["cortexfs-docs"]}]


def test_a_view_grants_nothing_from_a_policy_the_agent_can_rewrite(world: World):
    """F-1, P-5 step 4, docs/mount.md: the view is checked with the same chain as the
    runner, and a grant the agent could rewrite is no grant.  bob's policy handed to bob's
    uid by an administrator's slip (a ``chown -R``): ``ctx policy explain`` and ``ctx run``
    refuse bob everything at step 4; bob's uid then writes itself ``shared:proj write`` into
    it.  bob's view must not show the space (``ENOENT``) nor take the write."""
    w = world
    bob = w.user_of("bob")
    with agent_view(w, "bob") as mine:
        v = mine.where
        assert probe(bob, [["list", v / "shared"]]) == [{"ok": ["cortexfs-docs", SPACE]}]
        os.chown(w.policy("bob"), bob.uid, bob.gid)
        explained = w.ctx("policy", "explain", "bob", f"shared:{SPACE}", "read", "--json")
        assert explained.rc == 1 and explained.json()["step"] == 4, explained
        run = w.call("bob", "fs.list", {"path": "/ctx/shared"})
        assert run["status"] == "error" and run["error"]["step"] == 4, json.dumps(run["error"])
        own = run_as(
            bob,
            ["/bin/sh", "-c", f'echo "allow bob_t shared:{SPACE} write" >> "$1"', "sh",
             str(w.policy("bob"))],
            bob.groups,
        )  # fmt: skip
        assert own.returncode == 0, own.stderr
        planted = Path("shared") / SPACE / "data" / "planted-by-bob"
        wait_for(lambda: probe(bob, [["list", v / "shared"]]) == [{"ok": ["cortexfs-docs"]}], 3)
        got = probe(bob, [["list", v / "shared" / SPACE], ["write", v / planted, 0o022, "x"]])
        assert got == [{"err": "ENOENT"}, {"err": "ENOENT"}], got
        assert not (w.storage / planted).exists()
