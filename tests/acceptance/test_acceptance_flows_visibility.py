"""End-to-end flows of the X-1 visibility matrix of a shared space, as a team lead sets it up and
checks it: ``ctx shared create lab --group G`` (a group of its own, setgid directories), a tool
installed into ``--tier shared:lab``, four agents — members of G with ``shared:lab read write``,
with ``read`` alone and with no grant, and a non-member holding both rules — and two humans, a
member of G and a uid outside it.  For each combination every surface is asked the same
question and must give the same answer: ``ctx agent show`` (CTX_PATH), ``ctx policy explain``,
``ctx run`` in both modes, the fs.* tools on the space's ``data/``, ``ctx object list`` and
``ctx object which``, the space's queue (as humans, and as agents' workers), and the agent
views of ``ctx mount --as AGENT``; and a grant or a membership taken away changes each of them
on the very next call."""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    OnStorage,
    QueueCLI,
    Run,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    scratch_top,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents and users as other uids")

SCRATCH = scratch_top(__file__)
SPACE, TOOL = "lab", "lab.echo"
# Prints a marker, its argv (terminal mode) and its input back.
ECHO = '#!/bin/sh\necho "lab-echo $*"\ncat\n'
FS_TOOLS = ("fs.read", "fs.write", "fs.list")
WAIT = 20.0

# The matrix: agent -> (member of G?, its shared:lab grants).
AGENTS = {
    "rw": (True, ["read", "write"]),
    "ro": (True, ["read"]),
    "none": (True, []),
    "out": (False, ["read", "write"]),
}


def free_gid() -> int:
    """A gid no group or user of the host has: the space's group G, named by number."""
    taken = {g.gr_gid for g in grp.getgrall()} | {p.pw_gid for p in pwd.getpwall()}
    return next(g for g in range(47700, 48600) if g not in taken)


def nobody() -> UnprivilegedUser:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody to stand for the uid outside the space's group")
    return UnprivilegedUser("nobody", entry.pw_uid, entry.pw_gid)


def replace_text(path: Path, text: str) -> None:
    """A control rewritten as a careful administrator does: a temp file renamed over it."""
    temp = path.with_name(path.name + ".edit")
    temp.write_text(text)
    temp.chmod(0o644)
    os.replace(temp, path)


def add_rule(policy: Path, rule: str) -> None:
    with policy.open("a") as f:
        f.write(rule + "\n")


def drop_rule(policy: Path, rule: str) -> None:
    lines = policy.read_text().splitlines(keepends=True)
    assert rule + "\n" in lines, policy.read_text()
    replace_text(policy, "".join(line for line in lines if line != rule + "\n"))


@dataclass
class Team(OnStorage):
    """Root's storage root (every uid may search it) holding space ``lab`` of group ``gid``
    with ``lab.echo`` in its tier and ``data/plan.txt``, and the agents of ``AGENTS`` a test
    makes (members run as ``member``'s uid, the non-member as ``outsider``'s)."""

    top: Path
    gid: int
    member: UnprivilegedUser
    outsider: UnprivilegedUser
    uids: dict[str, int] = field(default_factory=dict)

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def space(self) -> Path:
        return self.storage / "shared" / SPACE

    @property
    def tool(self) -> Path:
        return self.space / "tool" / TOOL

    def policy(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d" / "policy"

    def identity(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d" / "identity"

    def ctx_path(self, agent: str) -> list[str]:
        shown = self.ctx("agent", "show", agent, "--json")
        assert shown.rc == 0, shown
        assert shown.json()["problems"] == [], shown
        return shown.json()["ctx_path"].split(":")

    def explain(self, agent: str, obj: str, perm: str) -> dict:
        r = self.ctx("policy", "explain", agent, obj, perm, "--json")
        assert r.rc in (0, 1), r
        verdict = r.json()
        assert verdict["allowed"] is (r.rc == 0), r
        return verdict

    def terminal(self, agent: str, *argv: str) -> Run:
        return self.ctx("run", "--agent", agent, TOOL, *argv, input='{"t": 1}', timeout=WAIT)

    def native(self, agent: str, tool: str, value: dict) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", agent, tool, input=json.dumps(value),
                     timeout=WAIT)  # fmt: skip
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def events(self, agent: str, session: str = "default") -> list[dict]:
        uid = self.uids[agent]
        path = self.storage / "home" / str(uid) / "agent" / agent / "session" / session
        lines = (path / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def human(
        self, user: UnprivilegedUser, groups: list[int], *args: str, stdin: str = "", **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``ctx ARGS`` as ``user`` with exactly ``groups`` (a fresh login's groups)."""
        home = self.top / f"home-{user.name}"
        home.mkdir(exist_ok=True)
        os.chown(home, user.uid, user.gid)
        environment = {k: v for k, v in self.env.items() if not k.startswith("XDG_")}
        environment.update(HOME=str(home), USER=user.name, **env)
        return run_as(user, [*CTX_ARGV, *args], groups, env=environment, cwd=home, stdin=stdin)

    def make(self, *agents: str) -> None:
        """``ctx agent create`` for each of ``agents`` (of ``AGENTS``), each then allowed
        ``lab.echo`` and the fs.* tools in the tools' own policies too (P-6)."""
        for agent in agents:
            in_group, grants = AGENTS[agent]
            user = self.member if in_group else self.outsider
            groups = ["--groups", str(self.gid)] if in_group else []
            req = {"name": agent, "label": f"{agent}_t", "tools": [TOOL, *FS_TOOLS]}
            if grants:
                req["shared"] = {SPACE: grants}
            r = self.ctx("agent", "create", "--user", str(user.uid), *groups, "-",
                         input=json.dumps(req))  # fmt: skip
            assert r.rc == 0, r
            self.uids[agent] = user.uid
            for tool in FS_TOOLS:
                add_rule(self.storage / "tool" / f"{tool}.d" / "policy",
                         f"allow {agent}_t tool:{tool} execute")  # fmt: skip
            add_rule(self.tool.with_name(f"{TOOL}.d") / "policy",
                     f"allow {agent}_t tool:{TOOL} execute")  # fmt: skip


@pytest.fixture
def team(_template: Path, unprivileged_user: UnprivilegedUser) -> Iterator[Team]:
    """A copy of the bootstrapped root, ``ctx shared create lab --group G``, ``lab.echo``
    installed into ``--tier shared:lab``; tests make the agents they need."""
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="team-", dir=SCRATCH))
    top.chmod(0o755)
    team = Team(top, free_gid(), unprivileged_user, nobody())
    try:
        copy_of_root(_template, team.storage)
        made = team.ctx("shared", "create", SPACE, "--group", str(team.gid))
        assert made.rc == 0, made
        manifest = tool_manifest(top / "src", TOOL, ECHO)
        installed = team.ctx("object", "install", manifest, "--tier", f"shared:{SPACE}")
        assert installed.rc == 0 and str(team.tool) in installed.out, installed
        (team.space / "data" / "plan.txt").write_text("the plan\n")
        yield team
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ====================================================================== the space's tool


def test_each_agent_finds_and_runs_the_spaces_tool_as_its_path_and_explain_say(team):
    """X-1, T-4, T-5, P-5, P-6, S-2, T-7: the space's tool is on an agent's CTX_PATH exactly
    when its policy holds ``shared:lab read`` and its uid, gid and groups may enter the space
    (as ``execvp`` passes over a directory it may not search, a call is still judged against
    it when no other directory holds the name); it runs for the two members that may read the
    space, is not found (ENOENT, exit 127) for the member without the grant, and is refused at
    step 2 (mode bits, EACCES, exit 126) for the non-member holding both rules — ``ctx agent
    show``, ``ctx policy explain``, both modes of ``ctx run``, the sessions and the tool's own
    log telling the same story."""
    team.make(*AGENTS)
    lab_tool = f"/ctx/shared/{SPACE}/tool"
    for agent in AGENTS:
        path = team.ctx_path(agent)
        uid = team.uids[agent]
        assert path[:2] == ["/ctx/tool", f"/ctx/home/{uid}/tool"], (agent, path)
        assert (lab_tool in path) is (agent not in ("none", "out")), (agent, path)

    for agent in ("rw", "ro"):
        verdict = team.explain(agent, f"tool:{TOOL}", "execute")
        assert [s["result"] for s in verdict["steps"]] == ["pass"] * 6, verdict
        assert f"shared/{SPACE}/tool/{TOOL}" in verdict["steps"][1]["detail"], verdict
        term = team.terminal(agent, "a", "b")
        assert (term.rc, term.out) == (0, 'lab-echo a b\n{"t": 1}'), term
        r, result = team.native(agent, TOOL, {"who": agent})
        assert (r.rc, result["status"], result["exit_status"]) == (0, "ok", 0), r

    verdict = team.explain("none", f"tool:{TOOL}", "execute")
    assert (verdict["step"], verdict["errno"]) == (2, "ENOENT"), verdict
    term = team.terminal("none")
    assert term.rc == 127 and term.out == "", term
    assert term.err.startswith(f"ctx: ENOENT: no tool '{TOOL}' on the CTX_PATH of agent 'none'")
    assert lab_tool not in term.err, term
    r, result = team.native("none", TOOL, {"who": "none"})
    assert r.rc == 1 and result["error"]["error"] == "ENOENT", r
    assert result["exit_status"] is None, r

    verdict = team.explain("out", f"tool:{TOOL}", "execute")
    assert (verdict["step"], verdict["errno"]) == (2, "EACCES"), verdict
    assert f"shared/{SPACE}" in verdict["reason"], verdict
    term = team.terminal("out")
    assert term.rc == 126 and term.out == "", term
    assert f"EACCES: {verdict['reason']}" in term.err, (term, verdict)
    r, result = team.native("out", TOOL, {"who": "out"})
    error = result["error"]
    assert r.rc == 1 and (error["error"], error["stage"], error["step"]) == (
        "EACCES", "authorize", 2), r  # fmt: skip
    assert error["message"] == verdict["reason"], (error, verdict)

    # S-2, T-7: each call recorded where the agent's path found the tool; only the two
    # members that ran it left lines in the space tool's log.
    obj = f"shared/{SPACE}/tool/{TOOL}"
    for agent, outcome in (("rw", "ok"), ("ro", "ok"), ("out", "error")):
        results = [e for e in team.events(agent) if e["type"] == "tool_result"]
        assert [(e["object"], e["status"]) for e in results] == [(obj, outcome)] * 2, agent
    refused = [e for e in team.events("none") if e["type"] == "tool_result"]
    assert [(e["status"], e["errno"]) for e in refused] == [("error", "ENOENT")] * 2, refused
    log = team.tool.with_name(f"{TOOL}.d") / "log"
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    ran = [e["agent"] for e in logged if e["type"] == "tool_result" and e["status"] == "ok"]
    assert sorted(ran) == ["ro", "ro", "rw", "rw"], logged


# ====================================================================== the space's data


def test_the_fs_tools_read_and_write_the_space_as_the_grant_and_the_group_allow(team):
    """X-1, P-3, P-5 (steps 2, 3, 5), T-5, F-1: on ``/ctx/shared/lab``, ``fs.read``,
    ``fs.write`` and ``fs.list`` give each agent what ``ctx policy explain shared:lab
    read|write`` says: the read-write member writes (the file keeps the space's group), the
    read-only member reads and meets EROFS, the member without a grant and the non-member do
    not see the space at all; a refused write leaves nothing on disk."""
    team.make(*AGENTS)
    expected = {  # agent -> (explain read step, explain write step)
        "rw": (None, None),
        "ro": (None, 3),
        "none": (5, 3),
        "out": (2, 2),
    }
    data = team.space / "data"
    before = set(os.listdir(data))
    for agent, (read_step, write_step) in expected.items():
        assert team.explain(agent, f"shared:{SPACE}", "read")["step"] == read_step, agent
        assert team.explain(agent, f"shared:{SPACE}", "write")["step"] == write_step, agent

        _, listed = team.native(agent, "fs.list", {"path": "/ctx/shared"})
        names = {e["name"] for e in listed["output"]["entries"]}
        assert (SPACE in names) is (read_step is None), (agent, listed)
        assert "cortexfs-docs" in names  # the manual bundle is in every view

        _, read = team.native(agent, "fs.read", {"path": f"/ctx/shared/{SPACE}/data/plan.txt"})
        target = {"path": f"/ctx/shared/{SPACE}/data/by-{agent}", "content": agent}
        _, wrote = team.native(agent, "fs.write", target)
        if read_step is None:
            assert (read["status"], read["output"]["content"]) == ("ok", "the plan\n"), read
        else:
            assert read["output"]["error"] == "EACCES", read
            assert "not in the agent's view" in read["output"]["message"], read
        if write_step is None:
            assert wrote["status"] == "ok", wrote
        else:
            want = "EROFS" if read_step is None else "EACCES"
            assert (wrote["status"], wrote["output"]["error"]) == ("error", want), wrote

    assert set(os.listdir(data)) == before | {"by-rw"}
    st = (data / "by-rw").stat()
    assert (st.st_uid, st.st_gid) == (team.member.uid, team.gid)  # setgid: G kept
    assert (data / "by-rw").read_text() == "rw"


# ====================================================================== the agents' views


@contextlib.contextmanager
def views(team: Team, agents: list[str]) -> Iterator[dict[str, Path]]:
    """``ctx mount --as AGENT`` of each of ``agents``, started together, each at a mount
    point of its own; all unmounted and ended when the block ends."""
    points = {agent: team.top / f"view-{agent}" for agent in agents}
    procs: list[tuple[Path, subprocess.Popen]] = []
    try:
        for agent, point in points.items():
            point.mkdir()
            argv = [*CTX_ARGV, "mount", "--storage", str(team.storage), "--as", agent, str(point)]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=team.env)  # fmt: skip
            procs.append((point, proc))
        for point, proc in procs:
            up = lambda p=point, q=proc: mounted_at(p) or q.poll() is not None  # noqa: E731
            if not wait_for(up, MOUNT_WAIT):
                pytest.fail(f"ctx mount did not mount {point} in time")
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"ctx mount exited {proc.returncode}: {err.decode()}{out.decode()}")
        yield points
    finally:
        for point, _ in procs:
            if mounted_at(point):
                ctx_run("umount", point)
            if mounted_at(point):
                subprocess.run(["umount", "-l", str(point)], check=False)
        for _, proc in procs:
            try:
                proc.communicate(timeout=MOUNT_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@needs_fuse_as_root
def test_each_agents_mounted_view_shows_and_allows_what_its_calls_do(team):
    """F-1, T-5, X-1: the four views of ``ctx mount --as AGENT`` side by side: the space (and
    its tool) is listed only in the views of the members that may read it, a write through the
    view lands only for the read-write member (with the space's group) and is refused for the
    read-only one, and in the other two views the space's names do not even resolve — the
    same matrix the calls give — while no view leaves a file of its own in the root."""
    team.make(*AGENTS)
    before = snapshot(team.storage)
    with views(team, list(AGENTS)) as seen:
        for agent, view in seen.items():
            readable = agent in ("rw", "ro")
            assert (SPACE in os.listdir(view / "shared")) is readable, agent
            assert "cortexfs-docs" in os.listdir(view / "shared"), agent
            assert set(FS_TOOLS) <= set(os.listdir(view / "tool")), agent
            if readable:
                assert TOOL in os.listdir(view / "shared" / SPACE / "tool"), agent
                plan = view / "shared" / SPACE / "data" / "plan.txt"
                assert plan.read_text() == "the plan\n", agent
            else:
                for name in ("", "data/plan.txt", f"tool/{TOOL}"):
                    with pytest.raises(FileNotFoundError):
                        os.stat(view / "shared" / SPACE / name)
        written = seen["rw"] / "shared" / SPACE / "data" / "from-view"
        written.write_text("through the view\n")
        with pytest.raises(OSError) as refused:
            (seen["ro"] / "shared" / SPACE / "data" / "from-ro").write_text("no\n")
        assert refused.value.errno in (errno.EROFS, errno.EACCES), refused.value
        on_disk = team.space / "data" / "from-view"
        assert on_disk.read_text() == "through the view\n"
        assert on_disk.stat().st_gid == team.gid
        assert TOOL not in os.listdir(seen["none"] / "tool")  # a space tool stays in its space
    after = snapshot(team.storage)
    assert set(after) - set(before) == {f"shared/{SPACE}/data/from-view"}, set(after) ^ set(before)


# ====================================================================== the humans


def test_a_member_and_an_outsider_list_and_resolve_the_spaces_tools_as_their_groups_allow(team):
    """X-1, T-8a, T-4, R-1: humans on root's storage root: a member of G lists the space's
    tier and resolves its tool on a CTX_PATH naming it; a uid outside G is refused the tier
    (EACCES, exit 1, naming the space, its group and mode), never sees the tool in the full
    listing, and ``which`` says what it passed over — root sees everything; the member may not
    install into the space's tier (its owner's, EACCES); and the member started again without
    G (the membership taken away) gets the outsider's answers."""
    tier = ("object", "list", "--tier", f"shared:{SPACE}", "--json")
    path = f"/ctx/tool:/ctx/shared/{SPACE}/tool"
    as_root = team.ctx(*tier)
    assert as_root.rc == 0, as_root
    want = [(TOOL, f"shared:{SPACE}", str(team.tool), "available")]
    assert [(t["name"], t["tier"], t["path"], t["status"]) for t in as_root.json()] == want

    member = team.human(team.member, [team.gid], *tier)
    assert member.returncode == 0, member
    assert [(t["name"], t["path"], t["status"]) for t in json.loads(member.stdout)] == [
        (TOOL, str(team.tool), "available")]  # fmt: skip
    everything = team.human(team.member, [team.gid], "object", "list", "--json")
    assert (TOOL, f"shared:{SPACE}") in {(t["name"], t["tier"]) for t in json.loads(
        everything.stdout)}, everything  # fmt: skip
    which = team.human(team.member, [team.gid], "object", "which", TOOL, CTX_PATH=path)
    assert (which.returncode, which.stdout) == (0, f"{team.tool}\n"), which

    # A member runs the space's tools but installs none: tool/ is the owner's (02750).
    other = tool_manifest(team.top / "mine", "lab.mine", ECHO)
    shutil.chown(other.parent, team.member.uid, team.member.gid)
    install = ("object", "install", str(other), "--tier", f"shared:{SPACE}")
    refused = team.human(team.member, [team.gid], *install)
    assert refused.returncode == 1 and refused.stderr.startswith("ctx: EACCES: "), refused
    assert f"may not write in {team.space / 'tool'}" in refused.stderr, refused
    assert "mode 2750" in refused.stderr, refused
    assert not [n for n in os.listdir(team.space / "tool") if n.startswith("lab.mine")]

    for user, groups in ((team.outsider, []), (team.member, [])):
        refused = team.human(user, groups, *tier)
        assert refused.returncode == 1, refused
        error = json.loads(refused.stdout)
        assert (error["error"], error["errno"]) == ("EACCES", 13), refused
        for fact in (f"uid {user.uid} may not enter {team.space}", f"group {team.gid}", "3770"):
            assert fact in error["message"], (fact, error)
        assert refused.stderr.startswith("ctx: EACCES: "), refused
        listed = team.human(user, groups, "object", "list", "--json")
        assert listed.returncode == 0, listed
        names = {t["name"] for t in json.loads(listed.stdout)}
        assert "fs.read" in names and TOOL not in names, listed
        which = team.human(user, groups, "object", "which", "--json", TOOL, CTX_PATH=path)
        assert which.returncode == 1, which
        error = json.loads(which.stdout)
        assert error["error"] == "ENOENT", which
        assert f"passed over: {team.tool}: Permission denied" in error["message"], which


# ====================================================================== the space's queue


def job_request(who: str) -> str:
    return json.dumps({"tool": TOOL, "input": {"for": who}})


def drain_one(team: Team, agent: str) -> tuple[str, dict]:
    """``ctx queue work --drain --max-jobs 1`` as ``agent``: the job it finished, its result."""
    queue = QueueCLI(team.storage, SPACE)
    before = {s: set(os.listdir(queue.dir / s)) for s in ("done", "failed")}
    r = team.ctx("queue", "work", "--project", SPACE, "--agent", agent, "--drain",
                 "--max-jobs", "1", timeout=WAIT)  # fmt: skip
    assert r.rc == 0, r
    new = [(s, n) for s in before for n in set(os.listdir(queue.dir / s)) - before[s]]
    assert len(new) == 2, new  # the request and its result
    state, job = next((s, n) for s, n in new if not n.endswith(".result"))
    assert queue.state(job) == state, job
    return job, json.loads((queue.dir / state / f"{job}.result").read_text())


def test_the_spaces_queue_takes_work_from_members_only_and_runs_it_as_each_agent_may(team):
    """Q-1, Q-2, Q-4, §2.4, X-1, W-1: the member publishes jobs calling the space's tool; the
    uid outside G, and the member started again without G, are refused ``publish``, ``claim``
    and ``status`` with EACCES (exit 1, nothing on stdout, the queue byte for byte as it was,
    no temp file left); then the workers of three agents each take one job and finish it as
    ``ctx run`` would have ended the call: failed at step 2 for the non-member, failed ENOENT
    for the member without the grant, done for the read-only member — which the member reads
    back with ``ctx queue show``; and a claim the member holds survives the membership taken
    away (finish and renew refused, the job still claimed) until G is given back."""
    team.make("out", "none", "ro")
    queue = QueueCLI(team.storage, SPACE)
    jobs = []
    for n in range(3):
        args = ("queue", "publish", "--project", SPACE, "--name", f"job-{n}", "-")
        published = team.human(team.member, [team.gid], *args, stdin=job_request(f"job-{n}"))
        assert (published.returncode, published.stdout) == (0, f"job-{n}.req.json\n"), published
        jobs.append(f"job-{n}.req.json")
        entry = queue.dir / "pending" / jobs[-1]
        assert (entry.stat().st_uid, entry.stat().st_gid) == (team.member.uid, team.gid)

    before = snapshot(queue.dir)
    for user, groups in ((team.outsider, []), (team.member, [])):
        for verb, args, stdin in (
            ("publish", ["--name", "intruder", "-"], job_request("intruder")),
            ("claim", [], ""),
            ("status", [], ""),
        ):
            r = team.human(user, groups, "queue", verb, "--project", SPACE, *args, stdin=stdin)
            assert (r.returncode, r.stdout) == (1, ""), (user, verb, r)
            assert r.stderr.startswith("ctx: EACCES: "), (user, verb, r.stderr)
            assert f"uid {user.uid} may not " in r.stderr and f"group {team.gid}" in r.stderr
            assert "Traceback" not in r.stderr
    assert snapshot(queue.dir) == before
    assert os.listdir(queue.dir / "inbox") == []

    status = team.human(team.member, [team.gid], "queue", "status", "--project", SPACE, "--json")
    assert status.returncode == 0, status
    counts = json.loads(status.stdout)
    assert (counts["pending"], counts["claimed"], counts["done"], counts["failed"]) == (3, 0, 0, 0)

    outcomes = {agent: drain_one(team, agent) for agent in ("out", "none", "ro")}
    job, result = outcomes["out"]
    assert result["status"] == "error", result
    assert (result["error"]["error"], result["error"]["step"]) == ("EACCES", 2), result
    assert result["reason"].endswith("[authorize]") and f"shared/{SPACE}" in result["reason"]
    job, result = outcomes["none"]
    assert result["status"] == "error" and result["error"]["error"] == "ENOENT", result
    assert result["reason"].startswith(f"ENOENT: no tool '{TOOL}' on the CTX_PATH of agent")
    job, result = outcomes["ro"]
    assert result["status"] == "ok", result
    want = json.dumps({"for": job.removesuffix(".req.json")})
    assert result["output"] == f"lab-echo \n{want}\n", result
    assert result["agent"] == "ro" and result["exit_status"] == 0, result
    assert sorted(j for j, _ in outcomes.values()) == jobs

    shown = team.human(team.member, [team.gid], "queue", "show", "--project", SPACE, job, "--json")
    assert shown.returncode == 0, shown
    seen = json.loads(shown.stdout)
    assert seen["state"] == "done" and seen["result"]["status"] == "ok", seen
    assert seen["request"]["input"] == json.loads((queue.dir / "done" / job).read_text())["input"]

    # A claim the member holds when the membership goes: finish and renew are refused and the
    # job stays claimed, evidence untouched; back in G, the member finishes it.
    job = queue.publish({"tool": TOOL, "input": {"for": "desk"}}, name="desk")
    desk = subprocess.Popen(["sleep", "300"], user=team.member.uid, group=team.member.gid,
                            extra_groups=[team.gid])  # fmt: skip
    try:
        mine = ("queue", "claim", "--project", SPACE, "--pid", str(desk.pid), "--worker", "desk")
        claimed = team.human(team.member, [team.gid], *mine)
        assert (claimed.returncode, claimed.stdout) == (0, f"{job}\n"), claimed
        before = snapshot(queue.dir)
        for verb, args, stdin in (
            ("finish", [job, "--ok", "-"], '{"by": "desk"}'),
            ("renew", [job, "--pid", str(desk.pid)], ""),
        ):
            r = team.human(team.member, [], "queue", verb, "--project", SPACE, *args, stdin=stdin)
            assert (r.returncode, r.stdout) == (1, ""), (verb, r)
            assert r.stderr.startswith("ctx: EACCES: "), (verb, r.stderr)
        assert snapshot(queue.dir) == before and queue.state(job) == "claimed"
        done = team.human(team.member, [team.gid], "queue", "finish", "--project", SPACE, job,
                          "--ok", "-", stdin='{"by": "desk"}')  # fmt: skip
        assert (done.returncode, done.stdout) == (0, f"{job}\n"), done
    finally:
        desk.kill()
        desk.wait()
    assert queue.state(job) == "done"
    assert json.loads((queue.dir / "done" / f"{job}.result").read_text())["output"] == {
        "by": "desk"}  # fmt: skip
    for state in ("claimed", "lease", "inbox", "pending"):
        assert os.listdir(queue.dir / state) == [], state


# ====================================================================== revoking


@contextlib.contextmanager
def waiting_worker(team: Team, agent: str) -> Iterator[QueueCLI]:
    """``ctx queue work`` as ``agent`` waiting for jobs of the space for the whole block, then
    stopped with SIGTERM, which it obeys with exit 0 (W-4)."""
    argv = [*CTX_ARGV, "queue", "work", "--project", SPACE, "--agent", agent]
    proc = subprocess.Popen(argv, env=team.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        yield QueueCLI(team.storage, SPACE)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, (out, err)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_a_grant_or_a_membership_taken_away_changes_every_surface_on_the_next_call(team):
    """X-1, T-4, P-5, W-1, F-1: while a worker of the read-write member waits for jobs and
    (with FUSE) its view is mounted, the administrator drops ``shared:lab read`` from its
    policy, puts it back, then takes G out of its identity and gives it back; after each edit
    the very next ``ctx agent show``, ``ctx run``, ``fs.write`` into ``data/``, job of the
    space's queue and the view give one answer — found and allowed, not on the path (ENOENT),
    or refused at step 2 — and nothing the refused calls tried is left in the space."""
    team.make("rw")
    policy, identity = team.policy("rw"), team.identity("rw")
    read_rule = f"allow rw_t shared:{SPACE} read"
    member_identity = identity.read_text()
    fuse = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
    mounted = views(team, ["rw"]) if fuse else contextlib.nullcontext({})
    calls = 0

    def same_answer(queue: QueueCLI, view: Path | None, expect: str) -> None:
        nonlocal calls
        calls += 1
        path = team.ctx_path("rw")
        # On the path only while the agent may enter the space (T-4: derived from policy and
        # uid/gid); a call is judged against a closed space still, and refused at step 2.
        assert (f"/ctx/shared/{SPACE}/tool" in path) is (expect == "ok"), (expect, path)
        term = team.terminal("rw", str(calls))
        want_rc = {"ok": 0, "ENOENT": 127, "EACCES": 126}[expect]
        assert term.rc == want_rc, (expect, term)
        target = {"path": f"/ctx/shared/{SPACE}/data/n{calls}", "content": "x"}
        _, wrote = team.native("rw", "fs.write", target)
        assert (wrote["status"] == "ok") is (expect == "ok"), (expect, wrote)
        job = queue.publish({"tool": TOOL, "input": {"n": calls}})
        assert wait_for(lambda: queue.state(job) in ("done", "failed"), WAIT), queue.state(job)
        state = queue.state(job)
        result = json.loads((queue.dir / state / f"{job}.result").read_text())
        if expect == "ok":
            assert (state, term.out) == ("done", f'lab-echo {calls}\n{{"t": 1}}'), (result, term)
            assert result["output"] == f'lab-echo \n{{"n": {calls}}}\n', result
        else:
            assert state == "failed" and result["error"]["error"] == expect, result
            assert f"{expect}: " in term.err, term
            if expect == "EACCES":
                assert result["error"]["step"] == 2 and "step 2 (mode bits)" in term.err
        if view is not None:  # the view follows within about a second (docs/mount.md)
            listed = lambda: SPACE in os.listdir(view / "shared")  # noqa: E731
            assert wait_for(lambda: listed() is (expect == "ok"), 5, 0.05), expect

    with waiting_worker(team, "rw") as queue, mounted as seen:
        view = seen.get("rw")
        same_answer(queue, view, "ok")
        drop_rule(policy, read_rule)
        same_answer(queue, view, "ENOENT")
        add_rule(policy, read_rule)
        same_answer(queue, view, "ok")
        replace_text(identity, json.dumps({**json.loads(member_identity), "groups": []}))
        same_answer(queue, view, "EACCES")
        replace_text(identity, member_identity)
        same_answer(queue, view, "ok")

    assert sorted(os.listdir(team.space / "data")) == ["n1", "n3", "n5", "plan.txt"]
    assert len(os.listdir(queue.dir / "done")) == 2 * 3
    assert len(os.listdir(queue.dir / "failed")) == 2 * 2
    results = [e for e in team.events("rw", "worker") if e["type"] == "tool_result"]
    assert [e.get("errno") for e in results] == [None, "ENOENT", None, "EACCES", None], results
