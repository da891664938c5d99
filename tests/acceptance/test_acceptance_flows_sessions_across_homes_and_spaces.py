"""One session name in a home and in two shared spaces at once (SPEC §4 S-1 … S-6, X-1, T-7,
W-1; docs/sessions.md, docs/workers.md).

A storage root holds two spaces, ``spa`` and ``spb``, of group ``ctxshs-g``.  Agents ``al`` and
``am`` run as the real uid ``ctxshs-a``, ``bo``, ``cn`` and (later) ``eph`` as ``ctxshs-b``;
both uids are members of the group, ``ctxshs-o`` is a uid outside it.  The flows: one agent
recording the same session name in its home and in both spaces with concurrent ``ctx run``
processes while followers watch each place; three agents of two uids recording one name in one
space at once; first calls racing to make an agent's directories in three places; a worker and
``ctx run`` of one agent sharing a session name; torn lines in three places of one name and
``ctx session repair`` of each; ``--uid`` next to ``--project``; readers run by root, by the
agent's uid (with and without the space's group), by another member and by an outsider; the
agent's own view reading its sessions of two spaces; and an agent deleted and made again under
another uid, whose former directory in a space is not taken over.  Everything runs through the
``ctx`` command with real processes and real uids."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, members_of, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents and readers as other uids")

GROUP = "ctxshs-g"
SPACES = ("spa", "spb")
PLACES = ("home", *SPACES)
TOOLS = ("demo.echo", "fs.read", "fs.list")
ECHO = "#!/bin/sh\ncat\n"
CREATED = "2026-06-22T12:00:00Z"
# agent -> "a" or "b", the user it runs as
AGENTS = {"al": "a", "am": "a", "bo": "b", "cn": "b"}
PEEK = "peek"  # the one session al's policy lets it read (S-6)


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

    def relative(self, agent: str, session: str, where: str, user=None) -> str:
        """Where ``agent``'s session lives, from the storage root (S-1)."""
        if where == "home":
            uid = (user or self.user_of(agent)).uid
            return f"home/{uid}/agent/{agent}/session/{session}"
        return f"shared/{where}/agent/{agent}/session/{session}"

    def place(self, agent: str, session: str, where: str, user=None) -> Path:
        return self.storage / self.relative(agent, session, where, user)

    def run(self, agent: str, session: str, where: str, payload: dict, tool="demo.echo") -> Run:
        """One native call of ``tool`` by ``agent``, recorded in ``session`` of ``where``."""
        project = () if where == "home" else ("--project", where)
        return self.ctx("run", "--agent", agent, "--session", session, *project, "--native",
                        tool, input=json.dumps(payload))  # fmt: skip

    def session(self, *args: str) -> Run:
        return self.ctx("session", *args)

    def session_as(self, user: UnprivilegedUser, *args: str, groups=None) -> Run:
        """``ctx session ARGS`` as ``user``: a member with the space's group unless
        ``groups`` says otherwise, the outsider with none; HOME nobody has."""
        if groups is None:
            groups = [] if user == self.outsider else [self.gid]
        argv = [*CTX_ARGV, "session", *args]
        done = subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=list(groups),
                              env={**self.env, "HOME": "/nonexistent"}, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        return Run(["session", *args], done.returncode, done.stdout, done.stderr)

    def make_agent(self, name: str, user: UnprivilegedUser, *rules: str) -> None:
        request = {"name": name, "label": f"{name}_t", "mount": [], "tools": list(TOOLS),
                   "shared": {space: ["read", "write"] for space in SPACES}}  # fmt: skip
        self.create_agent(request, "--user", user.name, "--groups", str(self.gid))
        self.allow_tool(f"{name}_t", *TOOLS)
        if rules:
            with (self.storage / "agent" / f"{name}.d" / "policy").open("a") as policy:
                policy.writelines(f"allow {name}_t {rule}\n" for rule in rules)

    def delete_agent(self, name: str) -> None:
        """The host removes the agent (its entry and its controls); its sessions stay."""
        (self.storage / "agent" / name).unlink()
        shutil.rmtree(self.storage / "agent" / f"{name}.d")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    (a, b), gid = members_of(GROUP, "ctxshs-a", "ctxshs-b")
    (outsider,) = users_named("ctxshs-o")
    top = new_scratch_dir(scratch_top(__file__))
    try:
        storage = top / "storage"
        w = World(storage, top, a, b, outsider, gid)
        r = w.ctx("bootstrap", "--storage", storage)
        assert r.rc == 0, r
        for space in SPACES:
            r = w.ctx("shared", "create", space, "--group", GROUP)
            assert r.rc == 0, r
        r = w.ctx("object", "install", tool_manifest(top / "m", "demo.echo", ECHO),
                  "--tier", "system")  # fmt: skip
        assert r.rc == 0, r
        for name, who in AGENTS.items():
            rules = (f"session:{PEEK} read",) if name == "al" else ()
            w.make_agent(name, a if who == "a" else b, *rules)
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------ helpers


def ok(r: Run) -> dict:
    """The result frame of a native call that must have succeeded."""
    assert r.rc == 0, r
    frame = json.loads(r.lines()[-1])
    assert frame["type"] == "result" and frame["status"] == "ok", r
    return frame


def refused(r: Run, rc: int, errno_name: str, *words: str) -> None:
    assert r.rc == rc, r
    assert f"{errno_name}:" in r.err and "Traceback" not in r.out + r.err, r
    for word in words:
        assert word in r.err, (word, r)


def strict_lines(path: Path) -> list[dict]:
    """Every line of ``path`` as JSON; the file ends with a newline (no torn line)."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def json_lines(r: Run) -> list[dict]:
    assert r.rc == 0, r
    return [json.loads(line) for line in r.lines()]


def calls_of(events: list[dict]) -> dict[str, list[str]]:
    """Each call id and the types of its events, in order."""
    calls: dict[str, list[str]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], []).append(event["type"])
    return calls


def tags_of(events: list[dict]) -> list[str]:
    return sorted(e["input"]["tag"] for e in events if e["type"] == "tool_call")


def follow(world: World, out: Path, *args: str) -> subprocess.Popen:
    """``ctx session tail --follow --json ARGS`` writing to ``out``, in a session of its own."""
    with out.open("wb") as sink:
        return subprocess.Popen([*CTX_ARGV, "session", "tail", *args, "--follow", "--json"],
                                stdout=sink, stderr=subprocess.PIPE, env=world.env,
                                start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen) -> int:
    """Ctrl-C to a follower (exit 0 as asked), SIGKILL if it does not end."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def line_count(path: Path) -> int:
    return len(path.read_bytes().splitlines())


# ------------------------------------------------------------------ one agent, three places


def test_one_agent_records_one_session_name_in_its_home_and_two_spaces_at_once(world):
    """S-1, S-2, S-5, T-7, X-1: ``al`` records session ``tri`` with concurrent ``ctx run``
    processes in its home, in ``spa`` and in ``spb`` while a follower watches each place.
    Every call lands in the place it named and only there (its result frame and the tool log's
    ``session_dir`` say so), every ``tool_call`` has its ``tool_result``, ``show --json`` and
    each follower print exactly that place's file, and ``list`` of each place names ``tri``."""
    session = "tri"
    for where in PLACES:
        ok(world.run("al", session, where, {"tag": f"seed-{where}"}))
    outs = {where: world.top / f"follow-tri-{where}.jsonl" for where in PLACES}
    followers = {}
    try:
        for where in PLACES:
            project = () if where == "home" else ("--project", where)
            followers[where] = follow(world, outs[where], "al", session, *project, "-n", "1")
        for where in PLACES:
            assert wait_for(lambda w=where: line_count(outs[w]) == 1, 15), where
        jobs = [(where, f"{where}-{i}") for i in range(6) for where in PLACES]
        with ThreadPoolExecutor(6) as pool:
            frames = list(pool.map(lambda job: ok(world.run("al", session, job[0],
                                                            {"tag": job[1]})), jobs))  # fmt: skip
        for (where, _tag), frame in zip(jobs, frames, strict=True):
            assert frame["session"] == world.relative("al", session, where), frame
        files = {where: strict_lines(world.place("al", session, where) / "events.jsonl")
                 for where in PLACES}  # fmt: skip
        for where in PLACES:
            assert wait_for(lambda w=where: line_count(outs[w]) >= len(files[w]) - 1, 15), where
    finally:
        codes = {where: stop(proc) for where, proc in followers.items()}
    assert codes == dict.fromkeys(PLACES, 0), codes

    call_places: dict[str, str] = {}
    for where in PLACES:
        events = files[where]
        assert tags_of(events) == sorted([f"seed-{where}"] + [f"{where}-{i}" for i in range(6)])
        assert {(e["agent"], e["session"]) for e in events} == {("al", session)}, where
        pairs = calls_of(events)
        assert len(pairs) == 7 and all(p == ["tool_call", "tool_result"] for p in pairs.values())
        call_places.update(dict.fromkeys(pairs, where))
        project = () if where == "home" else ("--project", where)
        assert json_lines(world.session("show", "al", session, *project, "--json")) == events
        assert [json.loads(line) for line in outs[where].read_bytes().splitlines()] == events[1:]
        assert session in world.session("list", "al", *project).lines(), where
    assert len(call_places) == 21
    logged = [e for e in read_jsonl(world.storage / "tool" / "demo.echo.d" / "log")
              if e["call"] in call_places]  # fmt: skip
    assert len(logged) == 21, logged
    for line in logged:
        assert line["session_dir"] == world.relative("al", session, call_places[line["call"]])


def test_a_worker_and_runs_of_one_agent_sharing_a_session_name_stay_in_their_places(world):
    """S-1, W-1 (docs/workers.md: a worker's session is in the agent's home, its transitions
    naming the queue): ``al`` works ``spa``'s queue with ``--session dual`` while ``ctx run``
    records ``dual`` in ``spa`` and ``spb`` at the same time.  The worker's ``queue.*`` events
    and its calls (``job``) are all in the home's ``dual``; neither space's ``dual`` holds a
    queue event or a job's call."""
    session = "dual"
    jobs = [f"dual{i}" for i in range(4)]
    for name in jobs:
        req = {"tool": "demo.echo", "input": {"tag": f"job-{name}"}, "from": "t",
               "created": CREATED}  # fmt: skip
        r = world.ctx("queue", "publish", "--project", "spa", "--name", name, "-",
                      input=json.dumps(req))  # fmt: skip
        assert r.rc == 0, r
    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "spa", "--agent", "al", "--session", session,
         "--drain"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
    )  # fmt: skip
    try:
        runs = [(where, f"run-{where}-{i}") for i in range(3) for where in SPACES]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda job: ok(world.run("al", session, job[0], {"tag": job[1]})),
                          runs))  # fmt: skip
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, (out, err)

    home = strict_lines(world.place("al", session, "home") / "events.jsonl")
    for kind in ("queue.claim", "queue.start", "queue.finish"):
        seen = sorted(e["object"] for e in home if e["type"] == kind)
        assert seen == [f"queue/{name}.req.json" for name in jobs], (kind, seen)
        assert {e["queue"] for e in home if e["type"] == kind} == {"shared/spa/queue"}
    assert tags_of(home) == sorted(f"job-{name}" for name in jobs)
    assert all("job" in e for e in home if e["type"] == "tool_call"), home
    for where in SPACES:
        events = strict_lines(world.place("al", session, where) / "events.jsonl")
        assert {e["type"] for e in events} == {"tool_call", "tool_result"}, events
        assert not any("job" in e for e in events), events
        assert tags_of(events) == sorted(f"run-{where}-{i}" for i in range(3))


# ------------------------------------------------------------------ several agents, one space


def test_agents_of_two_uids_record_one_name_in_one_space_at_once_each_in_its_own(world):
    """S-1, S-6, X-1 (docs/sessions.md "Where sessions live"): ``al`` and ``am`` (uid a) and
    ``bo`` (uid b) record session ``crowd`` in ``spa`` with concurrent calls.  Each agent's
    ``crowd`` holds its own calls only, is its uid's with the space's group (03770, 0660); no
    ``crowd`` appears in any home; each reader prints only its agent's events, whoever runs
    it: root, uid a, uid b (members), while the outsider is refused (EACCES naming the
    space)."""
    session = "crowd"
    agents = ("al", "am", "bo")
    jobs = [(agent, f"{agent}-{i}") for i in range(4) for agent in agents]
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda job: ok(world.run(job[0], session, "spa", {"tag": job[1]})), jobs))
    for agent in agents:
        directory = world.place(agent, session, "spa")
        user = world.user_of(agent)
        events = strict_lines(directory / "events.jsonl")
        assert {e["agent"] for e in events} == {agent}, events
        assert tags_of(events) == sorted(f"{agent}-{i}" for i in range(4))
        status = directory.lstat()
        assert (status.st_mode & 0o7777, status.st_uid, status.st_gid) == (
            0o3770, user.uid, world.gid), agent  # fmt: skip
        file_status = (directory / "events.jsonl").lstat()
        assert (file_status.st_mode & 0o777, file_status.st_uid, file_status.st_gid) == (
            0o660, user.uid, world.gid), agent  # fmt: skip
        assert not world.place(agent, session, "home").exists(), agent
        assert session not in world.session("list", agent).lines(), agent
        for reader in (None, world.a, world.b):
            args = ("show", agent, session, "--project", "spa", "--json")
            r = world.session(*args) if reader is None else world.session_as(reader, *args)
            assert json_lines(r) == events, (agent, reader)
            args = ("list", agent, "--project", "spa", "--json")
            r = world.session(*args) if reader is None else world.session_as(reader, *args)
            listed = {entry["name"]: entry["path"] for entry in json.loads(r.out)}
            assert listed.get(session) == str(directory), (agent, reader, r)
        r = world.session_as(world.outsider, "show", agent, session, "--project", "spa")
        refused(r, 1, "EACCES", str(world.storage / "shared" / "spa"))
        assert r.out == "", r


def test_first_calls_racing_in_three_places_make_every_session_and_lists_are_complete(world):
    """S-1, S-5, X-1: ``cn`` (uid b) has no directory anywhere yet; twenty-one first calls at
    once, seven session names each in its home, ``spa`` and ``spb``, race to make its
    ``agent/cn/`` and ``session/`` directories.  None fails; every session holds exactly its
    call; ``list`` of each place names exactly those seven (``--json`` paths in that place);
    the directories are uid b's with the home's modes or the space's group and modes."""
    assert not world.place("cn", "x", "home").parent.parent.exists()
    names = {where: [f"r{where}{i}" for i in range(7)] for where in PLACES}
    jobs = [(where, name) for where in PLACES for name in names[where]]
    with ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(lambda job: world.run("cn", job[1], job[0], {"tag": job[1]}), jobs))
    assert [r.rc for r in runs] == [0] * len(jobs), [r for r in runs if r.rc]
    for where in PLACES:
        project = () if where == "home" else ("--project", where)
        parent = world.place("cn", "x", where).parent
        r = world.session("list", "cn", *project, "--json")
        assert r.rc == 0, r
        assert r.json() == [{"name": n, "path": str(parent / n)} for n in names[where]], r
        assert world.session("list", "cn", *project).lines() == names[where]
        for name in names[where]:
            events = strict_lines(parent / name / "events.jsonl")
            assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
            assert tags_of(events) == [name]
        for directory in (parent.parent, parent, parent / names[where][0]):
            status = directory.lstat()
            expected = (0o700, world.b.uid, world.b.gid) if where == "home" else (
                0o3770, world.b.uid, world.gid)  # fmt: skip
            assert (status.st_mode & 0o7777, status.st_uid, status.st_gid) == expected, directory


# ------------------------------------------------------------------ repair in three places


def test_torn_lines_in_three_places_of_one_name_are_each_cut_only_by_their_own_repair(world):
    """S-5 (docs/sessions.md "Reading, torn lines and repair"): ``al``'s session ``mend`` has
    a torn last line in its home, in ``spa`` and in ``spb``.  ``show`` of each mentions the
    torn line of its own file; ``repair --project spa`` cuts only spa's (``session`` names it,
    ``truncated_bytes`` its length) and the others keep theirs; ``repair --project spb`` run by
    the member uid b cuts spb's; ``repair`` run by the agent's own uid cuts the home's; then
    every ``repair`` says there is nothing to do and each file is what it was before the
    tear."""
    session = "mend"
    whole, torn = {}, {}
    for where in PLACES:
        ok(world.run("al", session, where, {"tag": where}))
        events = world.place("al", session, where) / "events.jsonl"
        whole[where] = events.read_bytes()
        torn[where] = f'{{"ts":"2026-01-01T00:00:00Z","type":"tool_call","agent":"{where}'
        with events.open("ab") as f:
            f.write(torn[where].encode())

    def state() -> dict[str, bytes]:
        return {w: (world.place("al", session, w) / "events.jsonl").read_bytes() for w in PLACES}

    for where in PLACES:
        project = () if where == "home" else ("--project", where)
        r = world.session("show", "al", session, *project, "--json")
        assert r.rc == 0 and tags_of(json_lines(r)) == [where], r
        assert "torn" in r.err and str(world.place("al", session, where)) in r.err, r

    r = world.session("repair", "al", session, "--project", "spa", "--json")
    assert r.rc == 0, r
    assert r.json()["session"] == world.relative("al", session, "spa"), r
    assert r.json()["truncated_bytes"] == len(torn["spa"]), r
    now = state()
    assert now["spa"] == whole["spa"], now
    for where in ("home", "spb"):
        assert now[where] == whole[where] + torn[where].encode(), where

    r = world.session_as(world.b, "repair", "al", session, "--project", "spb", "--json")
    assert r.rc == 0 and r.json()["truncated_bytes"] == len(torn["spb"]), r
    assert state()["home"] == whole["home"] + torn["home"].encode()
    r = world.session_as(world.a, "repair", "al", session, "--json", groups=[])
    assert r.rc == 0, r
    assert r.json()["session"] == world.relative("al", session, "home"), r
    assert r.json()["truncated_bytes"] == len(torn["home"]), r
    assert state() == whole
    for where in PLACES:
        project = () if where == "home" else ("--project", where)
        r = world.session("repair", "al", session, *project)
        assert r.rc == 0 and "nothing to do" in r.out, r


# ------------------------------------------------------------------ who reads what


def test_the_agents_uid_reads_its_space_sessions_only_with_the_spaces_group(world):
    """S-6, X-1 (visibility by uid, gid and groups): ``am``'s uid owns its session ``mine``
    in ``spa`` and in its home.  Run as that uid without the space's group, every reader of
    the space is refused (EACCES naming the space, its group and how to get in) while the
    home's readers work; with the group, the space's work too and print the space's events,
    never the home's."""
    session = "mine"
    ok(world.run("am", session, "home", {"tag": "home"}))
    ok(world.run("am", session, "spa", {"tag": "spa"}))
    space = str(world.storage / "shared" / "spa")
    for args in (("list", "am", "--project", "spa"), ("show", "am", session, "--project", "spa"),
                 ("tail", "am", session, "--project", "spa", "-n", "1"),
                 ("repair", "am", session, "--project", "spa")):  # fmt: skip
        r = world.session_as(world.a, *args, groups=[])
        refused(r, 1, "EACCES", space, str(world.gid))
        assert r.out == "", r
    own = world.session_as(world.a, "show", "am", session, "--json", groups=[])
    assert tags_of(json_lines(own)) == ["home"], own
    assert session in world.session_as(world.a, "list", "am", groups=[]).lines()
    shared = world.session_as(world.a, "show", "am", session, "--project", "spa", "--json")
    assert tags_of(json_lines(shared)) == ["spa"], shared
    tailed = world.session_as(world.a, "tail", "am", session, "--project", "spa", "-n", "2",
                              "--json")  # fmt: skip
    assert json_lines(tailed) == json_lines(shared), tailed
    r = world.session_as(world.b, "show", "am", session, "--json")
    refused(r, 1, "EACCES", f"home/{world.a.uid}")


def test_uid_names_a_home_and_with_project_it_is_a_usage_error(world):
    """docs/sessions.md "Commands" (``--uid`` is the home's uid; ``--project P`` means the
    session in ``shared/P/``): with ``--project``, a ``--uid`` of any value makes ``list``,
    ``show``, ``tail`` and ``repair`` a usage error (EINVAL, exit 2: a session lives in a home
    or in a space, S-1), never one of the two taken silently; without it, ``--uid`` of a home
    that holds no session of the agent lists nothing and ``show`` is ENOENT naming the ``ctx
    session list ... --uid`` command; a ``--uid`` out of range is EINVAL, exit 2, with
    ``--project`` too."""
    session = "uids"
    ok(world.run("al", session, "spa", {"tag": "spa"}))
    ok(world.run("al", session, "home", {"tag": "home"}))
    expected = json_lines(world.session("show", "al", session, "--project", "spa", "--json"))
    assert tags_of(expected) == ["spa"]
    for uid in (world.a.uid, world.b.uid, 4294967294):
        with_uid = ("--project", "spa", "--uid", str(uid))
        for command in (
            ("list", "al", *with_uid),
            ("show", "al", session, *with_uid, "--json"),
            ("tail", "al", session, *with_uid, "-n", "1"),
            ("repair", "al", session, *with_uid),
        ):
            refused(world.session(*command), 2, "EINVAL", "give one of them")
    assert json_lines(world.session("show", "al", session, "--project", "spa", "--json")) == (
        expected
    )
    other = str(world.b.uid)
    r = world.session("list", "al", "--uid", other, "--json")
    assert (r.rc, r.json()) == (0, []), r
    r = world.session("show", "al", session, "--uid", other)
    refused(r, 1, "ENOENT", f"ctx session list al --uid {other}")
    home = world.session("show", "al", session, "--uid", str(world.a.uid), "--json")
    assert tags_of(json_lines(home)) == ["home"], home
    r = world.session("list", "al", "--project", "spa", "--uid", "4294967295")
    refused(r, 2, "EINVAL")


def test_the_agents_view_reads_its_sessions_of_two_spaces_and_records_where_it_calls(world):
    """S-6, X-1, docs/mount.md (an agent sees its own shared session with ``session:<n>
    read``): ``al`` holds ``session:peek read``.  A call recorded in ``spb``'s ``peek`` reads
    ``spa``'s ``peek`` through the agent's ``/ctx``: it gets exactly what ``show --project spa``
    prints, and its own events go to ``spb``'s ``peek`` only; ``fs.list`` of each space's
    ``session/`` names ``peek`` but not the sessions it holds no rule for, and ``am`` (same
    uid, no rule) is refused ``al``'s ``peek`` (EACCES), its call recorded in its own home."""
    ok(world.run("al", PEEK, "spa", {"tag": "spa"}))
    ok(world.run("al", "hidden", "spa", {"tag": "hidden"}))
    ok(world.run("al", PEEK, "spb", {"tag": "spb"}))
    spa_file = world.place("al", PEEK, "spa") / "events.jsonl"
    before = spa_file.read_bytes()
    frame = ok(world.run("al", PEEK, "spb", {"path": f"/ctx/{world.relative('al', PEEK, 'spa')}"
                                                     "/events.jsonl"}, tool="fs.read"))  # fmt: skip
    assert frame["session"] == world.relative("al", PEEK, "spb"), frame
    shown = json_lines(world.session("show", "al", PEEK, "--project", "spa", "--json"))
    content = frame["output"]["content"]
    assert [json.loads(line) for line in content.splitlines()] == shown
    assert spa_file.read_bytes() == before
    spb_events = strict_lines(world.place("al", PEEK, "spb") / "events.jsonl")
    assert [e["object"] for e in spb_events[-2:]] == ["tool/fs.read"] * 2, spb_events
    for where in SPACES:
        listing = ok(world.run("al", "lister", "home", {
            "path": f"/ctx/shared/{where}/agent/al/session"}, tool="fs.list"))  # fmt: skip
        names = {entry["name"] if isinstance(entry, dict) else entry
                 for entry in listing["output"]["entries"]}  # fmt: skip
        assert PEEK in names and "hidden" not in names and "lister" not in names, listing
    denied = world.run("am", "default", "home",
                       {"path": f"/ctx/{world.relative('al', PEEK, 'spa')}/events.jsonl"},
                       tool="fs.read")  # fmt: skip
    assert denied.rc != 0, denied
    result = json.loads(denied.lines()[-1])
    assert result["error"]["error"] == "EACCES", result
    assert result["session"] == world.relative("am", "default", "home"), result
    assert spa_file.read_bytes() == before


# ------------------------------------------------------------------ sessions outliving agents


def test_a_deleted_agents_space_session_stays_readable_and_a_namesake_never_takes_it(world):
    """S-1, S-6, X-1, docs/sessions.md (sessions outlive their agent; the agent's directory in
    a space must be its own, else EACCES naming it and its owner): ``eph`` (uid a) records
    ``only`` in ``spa`` and nowhere else, and is deleted.  ``list``, ``show``, ``tail`` and
    ``repair`` with ``--project spa`` still read it, while the home readers say ENOENT (no
    home holds its sessions).  Made again as uid b, ``eph`` is refused in ``spa`` (EACCES
    naming ``agent/eph`` and uid a), nothing is added to the old session or made under it,
    and it records in ``spb`` and in uid b's home as usual."""
    world.make_agent("eph", world.a)
    ok(world.run("eph", "only", "spa", {"tag": "old"}))
    world.delete_agent("eph")
    old = world.place("eph", "only", "spa")
    before = (old / "events.jsonl").read_bytes()
    assert world.session("list", "eph", "--project", "spa").lines() == ["only"]
    shown = json_lines(world.session("show", "eph", "only", "--project", "spa", "--json"))
    assert tags_of(shown) == ["old"] and {e["agent"] for e in shown} == {"eph"}
    tailed = json_lines(world.session("tail", "eph", "only", "--project", "spa", "-n", "1",
                                      "--json"))  # fmt: skip
    assert tailed == shown[-1:]
    r = world.session("repair", "eph", "only", "--project", "spa")
    assert r.rc == 0 and "nothing to do" in r.out, r
    refused(world.session("list", "eph"), 1, "ENOENT", "eph")

    world.make_agent("eph", world.b)
    try:
        for session in ("only", "fresh"):
            r = world.run("eph", session, "spa", {"tag": "new"})
            assert r.rc == 1, r
            result = json.loads(r.lines()[-1])
            assert result["error"]["error"] == "EACCES", result
            message = result["error"]["message"]
            assert str(world.storage / "shared" / "spa" / "agent" / "eph") in message, message
            assert f"uid {world.a.uid}" in message, message
        assert (old / "events.jsonl").read_bytes() == before
        assert sorted(os.listdir(old.parent)) == ["only"]
        ok(world.run("eph", "fresh", "spb", {"tag": "spb"}))
        ok(world.run("eph", "fresh", "home", {"tag": "home"}))
        home = world.place("eph", "fresh", "home", user=world.b)
        assert home.lstat().st_uid == world.b.uid
        assert tags_of(strict_lines(home / "events.jsonl")) == ["home"]
        assert world.session("list", "eph").lines() == ["fresh"]
        assert world.session("list", "eph", "--project", "spa").lines() == ["only"]
    finally:
        world.delete_agent("eph")
