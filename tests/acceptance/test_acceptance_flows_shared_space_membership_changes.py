"""Shared spaces whose membership changes under a running system (SPEC §9 X-1, §5 P-3/P-5 with
``shared:<name> read|write``, §4 S-1/S-6, §6 T-4, §2 Q-1/Q-2, §3 W-1; docs/sessions.md
"Shared spaces", docs/policy.md "The authority chain", docs/tools.md "CTX_PATH" and the
``--as AGENT`` table, docs/queue.md).

Spaces are made with ``ctx shared create NAME --group G`` for groups made for the module (and
removed after it), then changed while agents, workers, followers and mounts use them: a user
leaves the group, the space gets another group, its mode is changed, it is removed and made
again under the same name, and the ``shared:<name>`` grants of an agent's policy change.  At
each moment what an agent or a user may see and do must follow the Linux permissions plus the
policy: ``ctx policy explain``, ``ctx run --project``, ``ctx agent show``'s ``CTX_PATH``, the
queue commands of a real non-root member, ``ctx session tail --follow``, ``ctx queue work`` and
``ctx mount --as``.  Refusals name their errno and the step or path; nothing of one space (or of
an earlier space of the same name) shows through another."""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import TEST_USER, UnprivilegedUser, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")

SCRATCH = scratch_top(__file__)
SPACE = "proj-m"
CALL = 30.0  # seconds: only a hang reaches it
_ACCOUNTS_LOCK = Path(tempfile.gettempdir()) / "cortexfs-test-accounts.lock"


# --------------------------------------------------------------------------------------------
# helpers


def _accounts(argv: list[str]) -> None:
    """One change to the user and group database, one process at a time."""
    with open(_ACCOUNTS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def temporary_group(name: str) -> Iterator[int]:
    """The group ``name``, made for the block (``groupadd --system``) and removed after it."""
    if shutil.which("groupadd") is None or shutil.which("groupdel") is None:
        pytest.skip("groupadd and groupdel are needed")
    with contextlib.suppress(KeyError):
        grp.getgrnam(name)
        _accounts(["groupdel", name])  # left over by a run that was killed
    _accounts(["groupadd", "--system", name])
    try:
        yield grp.getgrnam(name).gr_gid
    finally:
        _accounts(["groupdel", name])


@dataclass(frozen=True)
class People:
    user: UnprivilegedUser
    group_a: str
    gid_a: int
    group_b: str
    gid_b: int


@pytest.fixture(scope="module")
def people() -> Iterator[People]:
    """The test user and two groups of this module's own (neither holds the user at first)."""
    if shutil.which("gpasswd") is None:
        pytest.skip("gpasswd is needed")
    (user,) = users_named(TEST_USER)
    tag = os.getpid() % 100000
    with (
        temporary_group(f"ctxssm{tag}a") as gid_a,
        temporary_group(f"ctxssm{tag}b") as gid_b,
    ):
        yield People(user, f"ctxssm{tag}a", gid_a, f"ctxssm{tag}b", gid_b)


@dataclass
class World:
    top: Path
    people: People

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def space(self, name: str = SPACE) -> Path:
        return self.storage / "shared" / name

    def ctx(self, *args: str | os.PathLike, stdin: str = "") -> Run:
        return ctx_run(*args, input=stdin, env=self.env, timeout=CALL)

    def ok(self, *args: str | os.PathLike, stdin: str = "") -> Run:
        r = self.ctx(*args, stdin=stdin)
        assert r.rc == 0 and "Traceback" not in r.err, r
        return r

    def create_space(self, group: str, name: str = SPACE) -> Run:
        return self.ok("shared", "create", name, "--group", group)

    def agent(self, name: str, groups: list[int], shared: dict[str, list[str]], tools=()):
        """Agent ``name`` running as the test user with ``groups``, its policy granting
        ``shared`` and ``tools`` (both layers of P-6 for each tool)."""
        req = {"name": name, "label": f"{name}_t", "tools": list(tools), "shared": shared}
        self.ok("agent", "create", "--user", str(self.people.user.uid),
                "--groups", ",".join(map(str, groups)), "-", stdin=json.dumps(req))  # fmt: skip
        for tool in tools:
            policy = self.storage / "tool" / f"{tool}.d" / "policy"
            if policy.exists():
                with policy.open("a") as f:
                    f.write(f"allow {name}_t tool:{tool} execute\n")

    def space_tool(self, space: str, tool: str, text: str, *labels: str) -> None:
        """Root installs ``tool`` printing the JSON ``text`` in the space's tier."""
        program = f"#!/bin/sh\ncat >/dev/null\necho '{text}'\n"
        manifest = tool_manifest(self.top / f"src-{space}-{tool}", tool, program)
        self.ok("object", "install", manifest, "--tier", f"shared:{space}")
        with (self.space(space) / "tool" / f"{tool}.d" / "policy").open("a") as f:
            f.writelines(f"allow {label} tool:{tool} execute\n" for label in labels)

    def explain(self, agent: str, obj: str, perm: str) -> Run:
        r = self.ctx("policy", "explain", agent, obj, perm)
        assert r.rc in (0, 1) and "Traceback" not in r.err, r
        return r

    def native(self, agent: str, tool: str, value: dict, *args: str) -> tuple[Run, dict]:
        r = self.ctx("run", "--agent", agent, *args, "--native", tool, stdin=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result" and "Traceback" not in r.err, r
        return r, frames[-1]

    def drop_rule(self, agent: str, rule: str) -> None:
        policy = self.storage / "agent" / f"{agent}.d" / "policy"
        lines = policy.read_text().splitlines(keepends=True)
        assert rule + "\n" in lines
        policy.write_text("".join(line for line in lines if line != rule + "\n"))

    def add_rule(self, agent: str, rule: str) -> None:
        with (self.storage / "agent" / f"{agent}.d" / "policy").open("a") as f:
            f.write(rule + "\n")

    def as_user(self, groups: list[int] | None, *args: str | os.PathLike) -> Run:
        """``ctx ARGS`` as the test user with exactly ``groups`` (None: those the group
        database gives it now, as a new login would get)."""
        user = self.people.user
        extra = user.groups if groups is None else groups
        env = {k: v for k, v in self.env.items() if not k.startswith("XDG_")}
        env.update(HOME="/nonexistent")
        proc = subprocess.run(
            [*CTX_ARGV, *map(str, args)], env=env, cwd="/", capture_output=True, text=True,
            timeout=CALL, user=user.uid, group=user.gid, extra_groups=extra, umask=0o022,
        )  # fmt: skip
        return Run([str(a) for a in args], proc.returncode, proc.stdout, proc.stderr)

    def ctx_path(self, agent: str) -> list[str]:
        return self.ok("agent", "show", agent, "--json").json()["ctx_path"].split(":")


@pytest.fixture
def world(_template: Path, people: People) -> Iterator[World]:
    """A copy of the bootstrapped root where every uid may search it, in a scratch directory
    of its own (0755)."""
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="w-", dir=SCRATCH))
    top.chmod(0o755)
    w = World(top, people)
    copy_of_root(_template, w.storage)
    try:
        yield w
    finally:
        for member in (people.group_a, people.group_b):
            if people.user.name in grp.getgrnam(member).gr_mem:
                _accounts(["gpasswd", "-d", people.user.name, member])
        shutil.rmtree(top, ignore_errors=True)


def verdict(r: Run) -> str:
    """The last line of ``ctx policy explain``: ``allow`` or ``deny: ERRNO: step N ...``."""
    return r.lines()[-1]


# --------------------------------------------------------------------------------------------
# the authority chain at each moment


def test_explain_follows_chmod_regroup_and_remaking_of_the_space(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.agent("alpha", [p.gid_a], {SPACE: ["read", "write"]})
    world.agent("beta", [p.gid_b], {SPACE: ["read", "write"]})
    obj = f"shared:{SPACE}"

    assert verdict(world.explain("alpha", obj, "write")) == "allow"
    assert verdict(world.explain("beta", obj, "read")).startswith("deny: EACCES: step 2")

    # chmod the space: the group loses its bits, at once
    world.space().chmod(0o3700)
    denied = verdict(world.explain("alpha", obj, "read"))
    assert denied.startswith("deny: EACCES: step 2 (mode bits)"), denied
    assert f"shared/{SPACE}" in denied and "3700" in denied, denied

    # `ctx shared create --group` puts the modes back
    world.create_space(p.group_a)
    assert world.space().stat().st_mode & 0o7777 == 0o3770
    assert verdict(world.explain("alpha", obj, "write")) == "allow"

    # another group for the space: alpha is out, beta in
    regrouped = world.create_space(p.group_b)
    assert f"group {p.gid_a} -> {p.gid_b}" in regrouped.out, regrouped
    denied = verdict(world.explain("alpha", obj, "read"))
    assert denied.startswith("deny: EACCES: step 2") and f"0:{p.gid_b}" in denied, denied
    assert verdict(world.explain("beta", obj, "write")) == "allow"

    # removed: ENOENT at step 2 for both; made again with group A: alpha in, beta out
    shutil.rmtree(world.space())
    for agent in ("alpha", "beta"):
        gone = verdict(world.explain(agent, obj, "read"))
        assert gone.startswith("deny: ENOENT: step 2") and f"shared/{SPACE}" in gone, gone
    world.create_space(p.group_a)
    assert verdict(world.explain("alpha", obj, "read")) == "allow"
    assert verdict(world.explain("beta", obj, "read")).startswith("deny: EACCES: step 2")


def test_grant_changes_for_the_space_apply_at_the_next_call(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.space_tool(SPACE, "m.echo", '{"from": "space"}', "gamma_t")
    world.agent("gamma", [p.gid_a], {SPACE: ["read", "write"]}, tools=["m.echo"])
    space_tools = f"/ctx/shared/{SPACE}/tool"
    session = world.space() / "agent" / "gamma"

    assert space_tools in world.ctx_path("gamma")
    r, frame = world.native("gamma", "m.echo", {}, "--project", SPACE)
    assert r.rc == 0 and frame["output"] == {"from": "space"}, r
    assert frame["session"] == f"shared/{SPACE}/agent/gamma/session/default"

    # without write: the call that would record in the space is refused, nothing recorded
    before = (session / "session" / "default" / "events.jsonl").read_bytes()
    world.drop_rule("gamma", f"allow gamma_t shared:{SPACE} write")
    denied = verdict(world.explain("gamma", f"shared:{SPACE}", "write"))
    assert denied.startswith(("deny: EACCES: step 3", "deny: EACCES: step 5")), denied
    assert f"shared:{SPACE} write" in denied, denied
    r, frame = world.native("gamma", "m.echo", {}, "--project", SPACE, "--session", "s2")
    assert r.rc == 1 and frame["error"]["error"] == "EACCES", r
    assert frame["error"]["stage"] == "session" and frame["error"]["step"] in (3, 5), r
    assert (session / "session" / "default" / "events.jsonl").read_bytes() == before
    assert not (session / "session" / "s2").exists()
    # reading still finds the space's tool, recorded in the home
    r, frame = world.native("gamma", "m.echo", {})
    assert r.rc == 0 and frame["output"] == {"from": "space"}, r

    # without read: the space leaves CTX_PATH, its tool is no longer found
    world.drop_rule("gamma", f"allow gamma_t shared:{SPACE} read")
    assert space_tools not in world.ctx_path("gamma")
    r, frame = world.native("gamma", "m.echo", {})
    assert r.rc == 1 and frame["error"]["error"] == "ENOENT", r
    assert verdict(world.explain("gamma", f"shared:{SPACE}", "read")).startswith(
        "deny: EACCES: step 5"
    )

    # granted again: back at once
    world.add_rule("gamma", f"allow gamma_t shared:{SPACE} read")
    world.add_rule("gamma", f"allow gamma_t shared:{SPACE} write")
    r, frame = world.native("gamma", "m.echo", {}, "--project", SPACE)
    assert r.rc == 0 and frame["output"] == {"from": "space"}, r


def test_an_agent_granted_one_space_reaches_nothing_of_another(world: World):
    p = world.people
    world.create_space(p.group_a, "left")
    world.create_space(p.group_a, "right")  # same group: only the policy tells them apart
    world.space_tool("right", "r.echo", '{"from": "right"}', "delta_t")
    world.agent("delta", [p.gid_a], {"left": ["read", "write"]}, tools=["r.echo", "fs.list"])
    before = sorted(
        str(x.relative_to(world.space("right"))) for x in world.space("right").rglob("*")
    )

    assert "/ctx/shared/right/tool" not in world.ctx_path("delta")
    r, frame = world.native("delta", "r.echo", {})
    assert r.rc == 1 and frame["error"]["error"] == "ENOENT", r
    r, frame = world.native("delta", "fs.list", {"path": "/ctx/shared"}, "--project", "left")
    assert r.rc == 0, r
    assert {e["name"] for e in frame["output"]["entries"]} == {"left", "cortexfs-docs"}, frame
    r, frame = world.native("delta", "fs.list", {"path": "/ctx/shared/right"})
    assert r.rc == 1 and frame["status"] == "error", r
    r, frame = world.native("delta", "fs.list", {"path": "/ctx"}, "--project", "right")
    assert r.rc == 1 and frame["error"]["error"] == "EACCES", r
    assert frame["error"]["stage"] == "session", r
    after = sorted(
        str(x.relative_to(world.space("right"))) for x in world.space("right").rglob("*")
    )
    assert after == before  # no session directory, no log line in the other space


# --------------------------------------------------------------------------------------------
# a real member of the group, joining and leaving


def test_a_user_who_leaves_the_group_loses_the_queue_with_clear_errors(world: World):
    p = world.people
    world.create_space(p.group_a)
    request = world.top / "req.json"
    request.write_text(json.dumps({"tool": "fs.list", "input": {}, "from": "m",
                                   "created": "2026-06-22T12:00:00Z"}))  # fmt: skip
    request.chmod(0o644)
    queue = world.space() / "queue"

    _accounts(["gpasswd", "-a", p.user.name, p.group_a])
    assert p.gid_a in p.user.groups
    first = world.as_user(None, "queue", "publish", "--project", SPACE, "--name", "one", request)
    assert first.rc == 0 and first.out.strip() == "one.req.json", first
    with subprocess.Popen(["sleep", "300"]) as holder:
        try:
            claimed = world.as_user(None, "queue", "claim", "--project", SPACE,
                                    "--pid", str(holder.pid))  # fmt: skip
            assert claimed.rc == 0 and claimed.out.strip() == "one.req.json", claimed
            second = world.as_user(None, "queue", "publish", "--project", SPACE, "--name",
                                   "two", request)  # fmt: skip
            assert second.rc == 0, second

            _accounts(["gpasswd", "-d", p.user.name, p.group_a])
            assert p.gid_a not in p.user.groups
            result = world.top / "result.json"
            result.write_text("{}")
            result.chmod(0o644)
            for args in (
                ("publish", "--name", "three", request),
                ("claim",),
                ("list",),
                ("status",),
                ("show", "one.req.json"),
                ("finish", "one.req.json", "--ok", result),
            ):
                r = world.as_user(None, "queue", args[0], "--project", SPACE, *args[1:])
                assert r.rc == 1 and r.out == "", r
                assert r.err.startswith("ctx: EACCES: ") and "Traceback" not in r.err, r
                assert str(world.space()) in r.err and str(p.gid_a) in r.err, r
            # nothing changed meanwhile: one claimed (its holder alive), one pending
            assert os.listdir(queue / "pending") == ["two.req.json"]
            assert (queue / "claimed" / "one.req.json" / "one.req.json").is_file()
            assert (queue / "lease" / "one.req.json" / "worker").is_file()
            assert os.listdir(queue / "done") == []

            # back in the group: the member finishes its claim
            _accounts(["gpasswd", "-a", p.user.name, p.group_a])
            done = world.as_user(None, "queue", "finish", "--project", SPACE, "one.req.json",
                                 "--ok", result)  # fmt: skip
            assert done.rc == 0, done
            assert sorted(os.listdir(queue / "done")) == ["one.req.json", "one.req.json.result"]
        finally:
            holder.kill()


def test_a_member_cannot_regroup_a_space_to_a_group_it_is_not_in(world: World):
    p = world.people
    world.create_space(p.group_a)
    modes = {
        d: (d.stat().st_gid, d.stat().st_mode) for d in [world.space(), *world.space().rglob("*")]
    }

    moved = world.as_user([p.gid_a], "shared", "create", SPACE, "--group", p.group_b)
    assert moved.rc == 1 and moved.err.startswith("ctx: EPERM: "), moved
    assert str(p.gid_b) in moved.err or p.group_b in moved.err, moved
    outside = world.as_user([], "shared", "create", SPACE)
    assert outside.rc == 1 and outside.err.startswith("ctx: EACCES: "), outside
    assert str(world.space()) in outside.err, outside
    again = world.as_user([p.gid_a], "shared", "create", SPACE)
    assert again.rc == 0 and "nothing to do" in again.out, again
    after = {
        d: (d.stat().st_gid, d.stat().st_mode) for d in [world.space(), *world.space().rglob("*")]
    }
    assert after == modes


def test_a_members_session_follower_ends_when_the_space_is_regrouped_away(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.agent("eps", [p.gid_a], {SPACE: ["read", "write"]}, tools=["fs.list"])
    r, _ = world.native("eps", "fs.list", {"path": "/ctx"}, "--project", SPACE)
    assert r.rc == 0, r

    user = p.user
    env = {k: v for k, v in world.env.items() if not k.startswith("XDG_")}
    env.update(HOME="/nonexistent")
    out, err = world.top / "follow.out", world.top / "follow.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        follower = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", "eps", "--project", SPACE, "-n", "1", "--follow"],
            stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env, cwd="/",
            user=user.uid, group=user.gid, extra_groups=[p.gid_a],
        )  # fmt: skip
    try:
        assert wait_for(lambda: "tool_result" in out.read_text(), 15), err.read_text()
        world.create_space(p.group_b)  # the follower's uid is in group A only
        assert wait_for(lambda: follower.poll() is not None, 15), "the follower kept going"
        assert follower.returncode == 1, err.read_text()
        said = err.read_text()
        assert "EACCES" in said and str(world.space()) in said and "Traceback" not in said
    finally:
        if follower.poll() is None:
            follower.send_signal(signal.SIGKILL)
        follower.wait()


# --------------------------------------------------------------------------------------------
# removed and made again under the same name


def test_a_running_worker_stops_when_its_space_is_removed_and_made_again(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.agent("zeta", [p.gid_a], {SPACE: ["read"]}, tools=["fs.list"])
    err = world.top / "worker.err"
    with open(err, "wb") as e:
        worker = subprocess.Popen(
            [*CTX_ARGV, "queue", "work", "--project", SPACE, "--agent", "zeta", "--json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=e, env=world.env,
            start_new_session=True,
        )  # fmt: skip
    try:
        assert worker.stdout is not None
        first = json.loads(worker.stdout.readline())
        assert first["event"] == "start", first
        shutil.rmtree(world.space())
        world.create_space(p.group_b)
        job = world.ok("queue", "publish", "--project", SPACE, "--name", "fresh", "-",
                       stdin=json.dumps({"tool": "fs.list", "input": {}, "from": "m",
                                         "created": "2026-06-22T12:00:00Z"}))  # fmt: skip
        assert job.out.strip() == "fresh.req.json"
        rest = worker.communicate(timeout=CALL)[0].decode()
        assert worker.returncode == 1, (rest, err.read_text())
        said = err.read_text()
        # ESTALE when it looks once the space is made again; ENOENT when it looks while
        # nothing is there (docs/workers.md): the worker's wakeup races the test's rmtree.
        assert "ESTALE" in said or "ENOENT" in said, said
        assert str(world.space() / "queue") in said, said
        # the new space's job was left alone for a worker started on it
        queue = world.space() / "queue"
        assert os.listdir(queue / "pending") == ["fresh.req.json"]
        assert os.listdir(queue / "done") == [] and os.listdir(queue / "failed") == []
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_space_made_again_under_the_same_name_shows_nothing_of_the_old(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.space_tool(SPACE, "m.ver", '{"v": 1}', "eta_t")
    world.agent("eta", [p.gid_a, p.gid_b], {SPACE: ["read", "write"]}, tools=["m.ver"])
    r, frame = world.native("eta", "m.ver", {}, "--project", SPACE, "--session", "old")
    assert r.rc == 0 and frame["output"] == {"v": 1}, r
    world.ok("queue", "publish", "--project", SPACE, "--name", "old-job", "-",
             stdin=json.dumps({"tool": "m.ver", "input": {}, "from": "m",
                               "created": "2026-06-22T12:00:00Z"}))  # fmt: skip
    (world.space() / "data" / "old-note").write_text("old")

    shutil.rmtree(world.space())
    listed = world.ctx("session", "list", "eta", "--project", SPACE)
    assert listed.rc == 1 and listed.err.startswith("ctx: ENOENT: "), listed
    world.create_space(p.group_b)
    assert world.space().stat().st_gid == p.gid_b

    assert world.ok("session", "list", "eta", "--project", SPACE).out == ""
    assert world.ok("queue", "list", "--project", SPACE).out.strip() == ""
    assert world.ok("object", "list", "--tier", f"shared:{SPACE}").out.strip() == ""
    assert os.listdir(world.space() / "data") == []
    r, frame = world.native("eta", "m.ver", {})
    assert r.rc == 1 and frame["error"]["error"] == "ENOENT", r

    world.space_tool(SPACE, "m.ver", '{"v": 2}', "eta_t")
    r, frame = world.native("eta", "m.ver", {}, "--project", SPACE, "--session", "old")
    assert r.rc == 0 and frame["output"] == {"v": 2}, r
    shown = world.ok("session", "show", "eta", "old", "--project", SPACE, "--json")
    events = [json.loads(line) for line in shown.lines()]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert world.ok("session", "list", "eta", "--project", SPACE).lines() == ["old"]


def test_a_space_made_older_style_names_its_repair_and_the_repair_lets_tools_run(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.space_tool(SPACE, "m.echo", '{"ok": true}', "theta_t")
    world.agent("theta", [p.gid_a], {SPACE: ["read"]}, tools=["m.echo"])
    for place in (world.space(), world.space() / "tool"):
        place.chmod(0o2770)  # group-writable, no sticky bit: members could swap tool/ away
        r, frame = world.native("theta", "m.echo", {})
        assert r.rc == 1 and frame["error"]["step"] == 6, r
        message = frame["error"]["message"]
        assert f"ctx shared create {SPACE} --group {p.gid_a}" in message, message
        repaired = world.create_space(p.group_a)
        assert "repaired" in repaired.out, repaired
        r, frame = world.native("theta", "m.echo", {})
        assert r.rc == 0 and frame["output"] == {"ok": True}, r


# --------------------------------------------------------------------------------------------
# CTX_PATH and spaces the agent's uid may not enter


def test_a_space_regrouped_away_leaves_the_agents_ctx_path(world: World):
    p = world.people
    world.create_space(p.group_b, "aa-first")
    world.create_space(p.group_b, "bb-second")
    world.space_tool("aa-first", "m.dup", '{"from": "aa"}', "iota_t")
    world.space_tool("bb-second", "m.dup", '{"from": "bb"}', "iota_t")
    world.agent("iota", [p.gid_b], {"aa-first": ["read"], "bb-second": ["read"]}, ["m.dup"])
    r, frame = world.native("iota", "m.dup", {})
    assert r.rc == 0 and frame["output"] == {"from": "aa"}, r

    world.create_space(p.group_a, "aa-first")  # the agent is in group B only
    view = world.ok("agent", "show", "iota", "--json").json()
    shared_listing = next(m[3] for m in view["tool_mounts"] if m[1] == "/ctx/shared")
    assert "aa-first" not in shared_listing  # its own view hides the space
    r, frame = world.native("iota", "m.dup", {})
    assert r.rc == 0 and frame["output"] == {"from": "bb"}, r
    assert "/ctx/shared/aa-first/tool" not in world.ctx_path("iota")


# --------------------------------------------------------------------------------------------
# a mounted view while the space changes


@needs_fuse_as_root
def test_an_agents_mounted_view_follows_the_space_as_it_changes(world: World):
    p = world.people
    world.create_space(p.group_a)
    world.agent("kappa", [p.gid_a], {SPACE: ["read", "write"]})
    where = world.top / "mnt"
    where.mkdir()
    shared = where / "shared"

    def listed() -> set[str]:
        return set(os.listdir(shared))

    def hidden() -> bool:
        return SPACE not in listed() and not os.path.lexists(shared / SPACE)

    def shown() -> bool:
        return SPACE in listed() and os.path.isdir(shared / SPACE / "data")

    with serving(world.storage, where, "--as", "kappa"):
        assert mounted_at(where)
        assert shown()
        world.space().chmod(0o3700)
        assert wait_for(hidden, 10), listed()
        world.create_space(p.group_a)
        assert wait_for(shown, 10), listed()
        world.drop_rule("kappa", f"allow kappa_t shared:{SPACE} read")
        assert wait_for(hidden, 10), listed()
        world.add_rule("kappa", f"allow kappa_t shared:{SPACE} read")
        assert wait_for(shown, 10), listed()
        world.create_space(p.group_b)
        assert wait_for(hidden, 10), listed()
        shutil.rmtree(world.space())
        world.create_space(p.group_a)
        (world.space() / "data" / "new-note").write_text("new")
        assert wait_for(lambda: shown() and os.listdir(shared / SPACE / "data") == ["new-note"], 10)
