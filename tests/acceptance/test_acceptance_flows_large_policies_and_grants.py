"""An agent or a storage root with a great deal of configuration (SPEC A-1, A-3, T-4, T-5, P-1,
P-3, P-5, P-6, P-8, W-1, X-1, F-1 and the limits docs/policy.md and docs/tools.md state):
policies of 100 000 lines with comments, blank lines and 64-byte labels; a policy at exactly
its 16 MiB limit and one byte past it; an agent request of 256 KiB naming ten thousand tools;
an agent whose policy lets it read ten thousand spaces that do not exist (a ``CTX_PATH`` far
longer than the 128 KiB the kernel passes in one variable); an agent that may write hundreds
of spaces; and a caller whose environment is close to the kernel's ``ARG_MAX``.

What a demanding user expects of every command (``ctx run``, ``ctx agent start``, ``ctx queue
work``, ``ctx policy check|query|explain``, ``ctx mount --as``): it works, or it refuses up
front with ``ctx: ERRNO: …`` naming the limit and what to shrink; never a bare E2BIG from
deep inside, a traceback, a grant dropped or widened without a word, or a queue drained into
``failed/`` for what is the agent's configuration.  Commands run under a timeout only a hang
reaches; nothing here asserts a duration."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    Run,
    clean_env,
    ctx_mount,
    ctx_run,
    needs_fuse_as_root,
    new_scratch_dir,
    request,
    scratch_top,
)
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
DEADLINE = 60  # seconds: a bound only a hang (or minutes of work) reaches
POLICY_LIMIT = 16 * 1024 * 1024  # docs/policy.md: a policy holds at most 16 MiB
REQUEST_LIMIT = 256 * 1024  # docs/policy.md: an agent request of at most 256 KiB
MAX_ARG_STRLEN = 128 * 1024  # Linux: the most one argument or variable of an exec holds
AGENT = "ci"
LABEL = "ci_t"
LONG_LABEL = "L" * 62 + "_t"  # a subject type of 64 bytes, the most R-3 allows
GHOSTS = 10_000  # spaces granted by policy that do not exist
WRITABLE_SPACES = 600


# ------------------------------------------------------------------------------- helpers


@dataclass
class World:
    """A bootstrapped root every uid may search (queue ``proj``), a workspace the agents'
    uid (nobody, root's default for agents) owns, and a scratch directory beside them."""

    root: Path
    scratch: Path
    workspace: Path
    terminals: list[str] = field(default_factory=list)  # sessions of ci to stop at the end

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root))

    def ctx(self, *args, input: str | bytes = b"", env: dict | None = None, cwd=None) -> Run:
        return ctx_run(*args, input=input, env=env or self.env, cwd=cwd, timeout=DEADLINE)

    def create(self, req: dict) -> Run:
        return self.ctx("agent", "create", "-", "--json", input=json.dumps(req))

    def make_agent(self, name: str, label: str, **more) -> None:
        """Agent ``name`` allowed ``shell.exec`` by both layers of P-6."""
        made = self.create({"name": name, "label": label, "tools": ["shell.exec"], **more})
        assert made.rc == 0, made
        with open(self.root / "tool" / "shell.exec.d" / "policy", "a") as policy:
            policy.write(f"allow {label} tool:shell.exec execute\n")

    def policy(self, name: str = AGENT) -> Path:
        return self.root / "agent" / f"{name}.d" / "policy"

    def add_rules(self, lines: list[str], name: str = AGENT) -> None:
        """Lines appended to the agent's policy by the host, as an administrator edits it."""
        with open(self.policy(name), "a") as policy:
            policy.writelines(f"{line}\n" for line in lines)

    def run_shell(self, cmd: str, name: str = AGENT, **kw) -> Run:
        return self.ctx("run", "--agent", name, "shell.exec", json.dumps({"cmd": cmd}), **kw)

    def space(self, name: str) -> Path:
        """Space ``name`` as ``ctx shared create`` lays it out (its group: the agents')."""
        made = self.ctx("shared", "create", name, "--group", "65534")
        assert made.rc == 0, made
        return self.root / "shared" / name


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    scratch = new_scratch_dir(SCRATCH)
    made = World(scratch / "storage", scratch, scratch / "ws")
    try:
        copy_of_root(_template, made.root)
        made.workspace.mkdir(mode=0o755)
        os.chown(made.workspace, 65534, 65534)
        yield made
    finally:
        for session in made.terminals:
            ctx_run("agent", "stop", AGENT, "--session", session, env=made.env)
        shutil.rmtree(scratch, ignore_errors=True)


def ok(run: Run) -> Run:
    assert run.rc == 0 and TRACEBACK not in run.err, run
    return run


def ghost_rules(label: str = LABEL, count: int = GHOSTS) -> list[str]:
    """``shared:<space> read`` rules for ``count`` spaces that do not exist."""
    return [f"allow {label} shared:ghost{i:05d} read" for i in range(count)]


def says_what_to_shrink(message: str) -> bool:
    """Whether an E2BIG about the agent's search path tells the user which grants to cut:
    its ``shared:`` rules, the spaces it may read."""
    return bool(re.search(r"\bshared\b|\bspaces?\b", message))


def copy_space(model: Path, target: Path) -> None:
    """``target`` made like the space ``model`` (owners and modes kept), as ``ctx shared
    create`` would lay it out: what a host with hundreds of spaces holds, made in bulk."""
    shutil.copytree(model, target, symlinks=True)
    for directory, names, files in os.walk(target):
        for entry in [directory, *(os.path.join(directory, n) for n in names + files)]:
            status = os.lstat(entry.replace(str(target), str(model), 1))
            os.chown(entry, status.st_uid, status.st_gid, follow_symlinks=False)
            os.chmod(entry, status.st_mode & 0o7777)


# ------------------------------------------------------ P-1, P-8: 100 000 lines of policy


def big_policy(label: str, grant_last: list[str]) -> str:
    """100 000 lines: a quarter comments (non-ASCII), a quarter blanks of spaces and tabs,
    half rules of 64-byte names for tools and models that do not exist; then ``grant_last``."""
    lines = []
    for i in range(100_000):
        kind = i % 4
        if kind == 0:
            lines.append(f"# rule group {i}: règles générées " + "é" * 30)
        elif kind == 1:
            lines.append(" \t  ")
        elif kind == 2:
            lines.append(f"allow {label} tool:{'t' * 58}{i:06d} execute")
        else:
            lines.append(f"allow {label} model:{'p' * 30}/{'m' * 58}{i:06d} use")
    return "\n".join(lines + grant_last) + "\n"


def test_a_policy_of_100000_lines_is_checked_queried_explained_and_obeyed_exactly(
    world: World,
) -> None:
    """P-1 (blank and ``#`` lines ignored), P-2/P-7 (one exact rule per grant: nothing
    widened), P-8 (check, query), P-5/P-6 (explain, run): agent ``wide`` of a 64-byte label
    whose policy is 100 000 lines (some 10 MB) with its real grants on the last lines.  The
    policy checks clean; ``query`` allows the exact rule and denies the rule for a label one
    byte shorter and for another permission; an invalid copy is reported at exactly its two
    bad lines deep inside; ``explain`` allows and the tool runs."""
    world.make_agent("wide", LONG_LABEL)
    policy = world.policy("wide")
    grants = [f"allow {LONG_LABEL} tool:shell.exec execute", f"allow {LONG_LABEL} mount:ctx read"]
    policy.write_text(big_policy(LONG_LABEL, grants))
    assert len(policy.read_text().splitlines()) == 100_002

    checked = ok(world.ctx("policy", "check", policy))
    assert (checked.out, checked.err) == ("", ""), checked
    rule = [f"tool:{'t' * 58}099998", "execute"]
    assert ok(world.ctx("policy", "query", "--policy", policy, LONG_LABEL, *rule)).out == "allow\n"
    shorter = world.ctx("policy", "query", "--policy", policy, LONG_LABEL[1:], *rule)
    assert (shorter.rc, shorter.out) == (1, "deny\n"), shorter
    model = f"model:{'p' * 30}/{'m' * 58}099999"
    other = world.ctx("policy", "query", "--policy", policy, LONG_LABEL, model, "execute")
    assert other.rc == 2 and "EINVAL" in other.err and TRACEBACK not in other.err, other

    bad = world.scratch / "bad.policy"
    lines = policy.read_text().splitlines()
    lines[77_776] = f"allow {LONG_LABEL} agent:* create"
    lines[99_998] = f"allow {LONG_LABEL} tool:shell.exec execute # trailing"
    bad.write_text("\n".join(lines) + "\n")
    refused = world.ctx("policy", "check", bad, "--json")
    assert refused.rc == 1 and TRACEBACK not in refused.err, refused
    [entry] = refused.json()["files"]
    assert [p["line"] for p in entry["problems"]] == [77_777, 99_999], entry["problems"]

    explained = ok(world.ctx("policy", "explain", "wide", "tool:shell.exec", "execute"))
    assert explained.lines()[-1] == "allow", explained
    assert ok(world.run_shell("echo ran", "wide")).out == "ran\n"


def test_a_policy_of_exactly_16_mib_is_read_and_one_byte_more_grants_nothing(
    world: World,
) -> None:
    """docs/policy.md (a policy holds at most 16 MiB; a larger one is refused with EFBIG
    naming it and its limit, never read in part): agent ``ci``'s grants on its first two
    lines, comments up to exactly 16 777 216 bytes: the tool runs.  One byte more and the
    first lines grant nothing: ``run`` is refused at step 5 with EFBIG naming the limit,
    ``explain`` denies, ``query`` is a malformed policy (exit 2) and ``check`` invalid."""
    world.make_agent(AGENT, LABEL)
    policy = world.policy()
    head = f"allow {LABEL} tool:shell.exec execute\nallow {LABEL} mount:ctx read\n".encode()
    filler = b"#" + b" policy padding" * 6 + b"\n"
    body = head + filler * ((POLICY_LIMIT - len(head)) // len(filler))
    body += b"#" * (POLICY_LIMIT - len(body) - 1) + b"\n"
    assert len(body) == POLICY_LIMIT
    policy.write_bytes(body)
    assert ok(world.run_shell("echo within")).out == "within\n"
    assert ok(world.ctx("policy", "check", policy)).err == ""

    policy.write_bytes(body + b"\n")
    ran = world.run_shell("echo past")
    assert ran.rc == 126 and ran.out == "" and TRACEBACK not in ran.err, ran
    assert ran.err.startswith("ctx: EFBIG: step 5 (object policy): "), ran
    assert str(POLICY_LIMIT) in ran.err, ran
    explained = world.ctx("policy", "explain", AGENT, "tool:shell.exec", "execute")
    assert explained.rc == 1 and explained.lines()[-1].startswith("deny: EFBIG: "), explained
    query = ["--policy", policy, LABEL, "tool:shell.exec", "execute"]
    queried = world.ctx("policy", "query", *query)
    assert queried.rc == 2 and queried.out == "" and str(POLICY_LIMIT) in queried.err, queried
    checked = world.ctx("policy", "check", policy)
    assert checked.rc == 1 and str(POLICY_LIMIT) in checked.err, checked


# ------------------------------------------------- a request naming ten thousand tools


def test_a_request_of_256_kib_naming_ten_thousand_tools_grants_each_one_and_one_byte_more_nothing(
    world: World,
) -> None:
    """A-3 (the policy grants what the request lists, one rule per grant) and docs/policy.md
    (a request holds at most 256 KiB): a request of just under 256 KiB naming 10 000 tools
    makes a policy with exactly one rule for each, and the agent runs a tool; a request one
    rule's worth over the limit is refused with EFBIG naming it, and nothing is made."""
    tools = [f"t{i:020d}" for i in range(10_000)]

    def sized(names: list[str], agent: str) -> str:
        return json.dumps({"name": agent, "label": f"{agent}_t", "tools": names})

    while len(sized([*tools, f"t{len(tools):020d}"], "many")) <= REQUEST_LIMIT:
        tools.append(f"t{len(tools):020d}")
    made = world.create(json.loads(sized(tools, "many")))
    assert made.rc == 0 and TRACEBACK not in made.err, made
    rules = [line for line in world.policy("many").read_text().splitlines() if "tool:" in line]
    assert rules == [f"allow many_t tool:{tool} execute" for tool in tools]
    world.add_rules(["allow many_t tool:shell.exec execute"], "many")
    with open(world.root / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write("allow many_t tool:shell.exec execute\n")
    assert ok(world.run_shell("echo many", "many")).out == "many\n"

    over = sized([*tools, f"t{len(tools):020d}"], "more")
    assert len(over) > REQUEST_LIMIT
    refused = world.ctx("agent", "create", "-", input=over)
    assert refused.rc == 1 and refused.err.startswith("ctx: EFBIG: "), refused
    assert str(REQUEST_LIMIT) in refused.err, refused
    assert not (world.root / "agent" / "more").exists()
    assert not (world.root / "agent" / "more.d").exists()


# ------------------------------- T-4: grants for ten thousand spaces that do not exist


def test_a_request_granting_ten_thousand_spaces_is_refused_at_create_or_its_agent_runs(
    world: World,
) -> None:
    """A-3, T-4 (an agent's ``CTX_PATH`` lists ``/ctx/shared/<space>/tool`` for each space
    its policy lets it read): a request granting ``read`` on 10 000 spaces (none of which
    exists) either is refused by ``ctx agent create`` up front, naming the limit and the
    spaces, as an over-long mount list is (``CTX_MOUNTS``), or makes an agent whose tools
    run.  Accepting it and failing every later call is neither."""
    shared = {f"ghost{i:05d}": ["read"] for i in range(GHOSTS)}
    made = world.create({"name": AGENT, "label": LABEL, "tools": ["shell.exec"], "shared": shared})
    if made.rc != 0:
        assert made.err.startswith("ctx: E2BIG: ") or made.err.startswith("ctx: EINVAL: "), made
        assert "CTX_PATH" in made.err and says_what_to_shrink(made.err), made
        assert not (world.root / "agent" / AGENT).exists()
        return
    with open(world.root / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:shell.exec execute\n")
    assert ok(world.run_shell("echo ran")).out == "ran\n"


@pytest.fixture
def ghostly(world: World) -> World:
    """Agent ``ci`` allowed ``shell.exec``, whose policy the host extended by hand with
    ``shared:<space> read`` for 10 000 spaces that do not exist; one real space ``real`` it
    may read, another, ``other``, it may not."""
    world.make_agent(AGENT, LABEL)
    world.space("real")
    world.space("other")
    world.add_rules([*ghost_rules(), f"allow {LABEL} shared:real read"])
    return world


@needs_fuse_as_root
def test_explain_show_and_mount_as_answer_for_an_agent_granted_ten_thousand_absent_spaces(
    ghostly: World,
) -> None:
    """P-8 (explain), F-1/T-5 (``ctx mount --as`` shows the spaces the policy lets the agent
    read, no more), and ``ctx agent show``: none of them is stopped by a search path too long
    to pass to a program.  The mount lists the one real space granted and the manual bundle,
    not the real space it was not granted nor any of the absent ones."""
    explained = ok(ghostly.ctx("policy", "explain", AGENT, "shared:real", "read"))
    assert explained.lines()[-1] == "allow", explained
    denied = ghostly.ctx("policy", "explain", AGENT, "shared:other", "read")
    assert denied.rc == 1 and denied.lines()[-1].startswith("deny: EACCES: "), denied
    shown = ok(ghostly.ctx("agent", "show", AGENT, "--json")).json()
    assert shown["ctx_path"].count(":/ctx/shared/ghost") == GHOSTS, len(shown["ctx_path"])
    where = ghostly.scratch / "mnt"
    with ctx_mount(ghostly.root, where, "--as", AGENT):
        assert sorted(os.listdir(where / "shared")) == ["cortexfs-docs", "real"]
        assert "queue" in os.listdir(where / "shared" / "real")


def test_a_call_whose_search_path_is_too_long_names_the_grants_to_shrink(
    ghostly: World,
) -> None:
    """T-4 and docs/tools.md (an error is a sentence the user can act on): every call of an
    agent whose ``CTX_PATH`` is over the 128 KiB one variable may hold cannot start; it is
    refused with E2BIG at stage ``run``, no traceback, recorded in its session; and the
    message names what made it too long and what to shrink: the agent's ``shared:`` grants,
    the spaces its policy lets it read (here 10 000, none of which exists)."""
    ran = ghostly.run_shell("echo ran")
    assert ran.rc == 126 and ran.err.startswith("ctx: E2BIG: "), ran
    assert "CTX_PATH" in ran.err and TRACEBACK not in ran.err, ran
    assert says_what_to_shrink(ran.err), ran.err


def test_the_terminal_of_an_agent_granted_ten_thousand_spaces_starts_or_says_why_not(
    ghostly: World,
) -> None:
    """A-1 (``ctx agent start`` starts the agent's terminal), T-4 (the runtime-injected
    ``CTX_PATH`` is the terminal's): the terminal of agent ``ci`` starts, or the command is
    refused saying that the agent's ``CTX_PATH`` is over the limit and which grants make it
    so; an E2BIG about the sandbox program's argument list tells the user nothing."""
    ghostly.terminals.append("wide")
    started = ghostly.ctx(
        "agent", "start", AGENT, "--session", "wide", "--json", cwd=ghostly.workspace
    )
    assert TRACEBACK not in started.err, started
    if started.rc == 0:
        return
    assert "CTX_PATH" in started.err and says_what_to_shrink(started.err), started


def test_a_worker_for_an_agent_whose_search_path_cannot_be_passed_claims_no_job(
    ghostly: World,
) -> None:
    """W-1 and docs/workers.md (a worker refuses what makes every job fail before it claims
    any, as it does for core tools of another version: "the worker claimed no job"): a
    worker started for agent ``ci``, whose every call is refused with E2BIG for its own
    configuration, either runs the job or leaves it pending and says why, exiting non-zero;
    it does not drain the queue into ``failed/``."""
    job = request("shell.exec")
    job["input"] = {"cmd": "echo job"}
    published = ok(ghostly.ctx("queue", "publish", "--project", "proj", "-", input=json.dumps(job)))
    name = published.out.strip()
    work = ["queue", "work", "--project", "proj", "--agent", AGENT, "--drain"]
    worked = ghostly.ctx(*work)
    assert TRACEBACK not in worked.err, worked
    queue = ghostly.root / "shared" / "proj" / "queue"
    assert not (queue / "failed" / name).exists(), worked
    if (queue / "pending" / name).exists():
        assert worked.rc != 0 and "CTX_PATH" in worked.err, worked


# ------------------------------------------------- X-1, T-5: hundreds of writable spaces


def test_an_agent_writing_hundreds_of_spaces_runs_its_tools_or_is_told_which_grants_to_cut(
    world: World,
) -> None:
    """X-1, A-3, T-5 (a tool reaches under ``/ctx`` the agent's projection: each space it may
    write is a read-write mount of the tool's ``CTX_MOUNTS``): an agent made with
    ``read``/``write`` on 600 spaces, all existing, runs ``shell.exec``; or, where that many
    spaces cannot be passed to a program, the call (or the create) is refused naming the
    spaces as what to shrink, not mounts and tools the agent barely has."""
    model = world.space("w0000")
    for i in range(1, WRITABLE_SPACES):
        copy_space(model, world.root / "shared" / f"w{i:04d}")
    shared = {f"w{i:04d}": ["read", "write"] for i in range(WRITABLE_SPACES)}
    req = {"name": AGENT, "label": LABEL, "tools": ["shell.exec"], "shared": shared}
    made = world.create(req)
    if made.rc != 0:
        assert TRACEBACK not in made.err and says_what_to_shrink(made.err), made
        return
    with open(world.root / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:shell.exec execute\n")
    explained = ok(world.ctx("policy", "explain", AGENT, f"shared:w{WRITABLE_SPACES - 1:04d}",
                             "write"))  # fmt: skip
    assert explained.lines()[-1] == "allow", explained
    ran = world.run_shell("echo ran")
    assert TRACEBACK not in ran.err, ran
    if ran.rc != 0:
        assert ran.err.startswith("ctx: E2BIG: ") and says_what_to_shrink(ran.err), ran.err
        return
    assert ran.out == "ran\n", ran


# --------------------------------------------------- A-1, T-5: a caller near ARG_MAX


def test_a_caller_environment_near_arg_max_reaches_neither_the_tool_nor_the_terminal(
    world: World,
) -> None:
    """T-5 / docs/tools.md (a tool's environment is built by the runtime; nothing leaks in
    from the caller's) and A-1: a caller with fifteen variables of nearly 128 KiB each (close
    to the 2 MiB the kernel passes to an exec in all) runs a tool, which sees none of them
    and an environment well under one variable's limit, and starts the agent's terminal."""
    world.make_agent(AGENT, LABEL)
    crowded = dict(world.env)
    for i in range(15):
        crowded[f"CROWD{i}"] = "x" * (MAX_ARG_STRLEN - 64)
    ran = ok(world.run_shell("env", env=crowded))
    assert "CROWD" not in ran.out and len(ran.out) < MAX_ARG_STRLEN, ran.out[:300]
    world.terminals.append("env")
    started = world.ctx(
        "agent", "start", AGENT, "--session", "env", "--json", env=crowded, cwd=world.workspace
    )
    assert ok(started).json()["session"] == "env", started
    stopped = world.ctx("agent", "stop", AGENT, "--session", "env")
    assert stopped.rc == 0, stopped
    world.terminals.remove("env")
