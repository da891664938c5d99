"""Sessions, policy v0, tools as files, tsh and ``ctx tool`` (SPEC §0, §1, §4–§7), checked
against the sentences of the specification alone: the command-line contracts of
``ctx policy check|query``, ``ctx object check|install|which|list``, ``ctx run`` (terminal and
native mode), ``ctx tool`` and ``ctx session repair``; the layouts of sessions, events, tool
controls and logs; default deny, the two policy layers and the step of the authority chain a
refusal names; ``CTX_PATH`` and ``.tshrc``; hooks; tsh's configuration and what a standalone
tsh may and may not do.  Every expectation names the requirement it comes from."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    clean_env,
    ctx_mount,
    ctx_run,
    kill_processes_of,
    needs_fuse_as_root,
    new_scratch_dir,
    read_jsonl,
    rfc3339,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)

ROOT_ENTRIES = {"bin", "tool", "agent", "model", "home", "shared"}
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
T1_FILES = ("name", "description", "schema", "cap", "policy", "status", "log")
S2_KEYS = ("ts", "type", "agent", "session", "object", "status")
TSH_DEFAULTS = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}
# P-3: the fixed classes and their permissions.
TABLE = {
    "tool": ("execute",),
    "model": ("use",),
    "shared": ("read", "write"),
    "session": ("read", "write", "resume"),
    "mount": ("read", "write"),
    "agent": ("create", "start", "stop", "read", "write"),
    "network": ("connect",),
}
NAME_OF_CLASS = {
    "tool": "fs.read",
    "model": "openai/gpt-5.6",
    "shared": "project-a",
    "session": "design-review",
    "mount": "workspace",
    "agent": "review-1",
    "network": "default",
}

# ------------------------------------------------------------------------------ helpers


def rules_of(path: Path) -> list[str]:
    """The rule lines of a policy file (P-1: blank and ``#`` lines are not rules)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def names_step(text: str, step: int) -> bool:
    """Whether ``text`` (a message or a recorded event) names step ``step`` of P-5."""
    return re.search(rf'step"?\s*:?\s*{step}\b', text) is not None


def key_values(text: str) -> dict[str, str]:
    """The ``key=value`` lines of tsh's configuration (H-4: blank and ``#`` lines aside)."""
    found = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            found[key.strip()] = value.strip()
    return found


def marker_program(out: Path, tag: str, body: str = "") -> str:
    """A tool program that leaves ``out/ran-TAG`` when it runs, then does ``body``."""
    return f"#!/bin/sh\ntouch {out}/ran-{tag}\n{body}"


@pytest.fixture(scope="session")
def template() -> Iterator[Path]:
    """One storage root made by ``ctx bootstrap`` per test process, copied for each test."""
    top = new_scratch_dir(TOP, "template-")
    root = top / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    yield root
    shutil.rmtree(top, ignore_errors=True)


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped storage root, a workspace an agent mounts, and an outbox every uid may
    write, all in a scratch directory every uid may search."""

    top: Path
    storage: Path
    ws: Path
    out: Path

    def agent(self, name: str, *, tools=(), shared=None, mounted: bool = True) -> int:
        """Create agent ``name`` (label ``name_t``) listing ``tools``; its uid."""
        request = {"name": name, "label": f"{name}_t", "tools": list(tools)}
        if shared:
            request["shared"] = shared
        request["mount"] = [[str(self.ws), "/workspace", "rw"]] if mounted else []
        return self.create_agent(request)["identity"]["uid"]

    def install(self, name: str, program: str, *args: str, tier: str = "system") -> Run:
        manifest = tool_manifest(self.top / "manifests", name, program)
        made = self.ctx("object", "install", manifest, "--tier", tier, *args)
        assert made.rc == 0, made
        return made

    def agent_allows(self, agent: str, tool: str) -> None:
        """The agent layer of P-6."""
        with (self.storage / "agent" / f"{agent}.d" / "policy").open("a") as policy:
            policy.write(f"allow {agent}_t tool:{tool} execute\n")

    def grant(self, agent: str, tool: str) -> None:
        """Both layers of P-6."""
        self.agent_allows(agent, tool)
        self.allow_tool(f"{agent}_t", tool)

    def session(self, agent: str, uid: int, session: str = "default") -> Path:
        return self.storage / "home" / str(uid) / "agent" / agent / "session" / session

    def ran(self, tag: str) -> bool:
        return (self.out / f"ran-{tag}").exists()


@pytest.fixture
def world(template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP, "w-")
    storage = top / "storage"
    subprocess.run(["cp", "-a", str(template), str(storage)], check=True)
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    ws.chmod(0o755)
    (ws / "a.txt").write_text("hello from the workspace\n")
    (ws / "a.txt").chmod(0o644)
    out = top / "out"
    out.mkdir()
    out.chmod(0o1777)
    try:
        yield World(top, storage, ws, out)
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def files() -> Iterator[Path]:
    """A scratch directory for policies and manifests checked without a storage root."""
    top = new_scratch_dir(TOP, "f-")
    yield top
    shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ P-1..P-4, P-8


def test_policy_check_accepts_every_class_permission_pair_comments_and_blank_lines(files):
    """P-1, P-3, P-7, P-8: one rule per line for every class/permission pair of the table,
    blank lines, whitespace-only lines and lines whose first non-blank byte is ``#`` make a
    valid policy: exit 0 and nothing on stderr."""
    lines = ["# a comment", "", "   # an indented comment", " \t ", "\t# after a tab"]
    for cls, perms in TABLE.items():
        lines += [f"allow coder_t {cls}:{NAME_OF_CLASS[cls]} {perm}" for perm in perms]
    lines.append("allow parent_t agent:review-1 create")
    policy = files / "good.policy"
    policy.write_text("\n".join(lines) + "\n")
    checked = ctx_run("policy", "check", policy)
    assert checked.rc == 0, checked
    assert checked.err == "", checked


BAD_RULES = {
    2: "deny coder_t tool:fs.read execute",  # P-2: no deny
    3: "allow coder_t agent:* create",  # P-2: no glob
    5: "allow coder_t file:x read",  # P-3: unknown class
    6: "allow coder_t tool:fs.read fly",  # P-3: unknown permission
    8: "allow coder_t tool:fs.read",  # P-1: three words
    9: "allow coder_t tool:fs.read execute now",  # P-1: five words
    10: "allow coder_t tool:/ctx/tool/fs.read execute",  # P-2: no path matching
    12: "allow coder_t tool:fs.* execute",  # P-2: no glob
    13: "allow coder_t tool:fs.read read",  # P-3: permissions of another class
    14: "allow coder_t shared:project-a execute",
    15: "allow coder_t session:design-review create",
    16: "allow coder_t mount:workspace execute",
    17: "allow coder_t network:default use",
    18: "allow coder_t agent:review-1 use",
    19: "allow coder_t model:openai/gpt-5.6 execute",
}


def test_policy_check_reports_each_bad_line_as_file_line_einval(files):
    """P-8: an invalid policy exits 1 with exactly one ``FILE:LINE: EINVAL: <reason>`` line
    on stderr per bad line: P-2 (no deny, no glob, no path), P-3 and P-4 (unknown class,
    unknown permission, a permission of another class), P-1 (four words)."""
    lines = {1: "allow coder_t tool:fs.read execute", 4: "# comment", 7: ""}
    lines[11] = "allow coder_t shared:project-a read"
    lines.update(BAD_RULES)
    policy = files / "bad.policy"
    policy.write_text("".join(f"{lines[n]}\n" for n in sorted(lines)))
    checked = ctx_run("policy", "check", policy)
    assert checked.rc == 1, checked
    pattern = re.compile(rf"^{re.escape(str(policy))}:(\d+): EINVAL: \S.*$")
    matched = [pattern.match(line) for line in checked.err.splitlines()]
    assert all(matched), checked
    assert sorted(int(m.group(1)) for m in matched) == sorted(BAD_RULES), checked


def test_policy_check_of_several_files_names_only_the_bad_ones(files):
    """P-8: ``ctx policy check FILE...``: each error line names its file; a valid file
    contributes none, and alone it exits 0."""
    good, bad = files / "good", files / "bad"
    good.write_text("allow a_t tool:x execute\n")
    bad.write_text("allow a_t tool:x execute\nallow a_t tool:x delete\n")
    both = ctx_run("policy", "check", good, bad)
    assert both.rc == 1, both
    assert both.err.splitlines() and all(
        line.startswith(f"{bad}:2: EINVAL: ") for line in both.err.splitlines()
    ), both
    alone = ctx_run("policy", "check", good)
    assert alone.rc == 0 and alone.err == "", alone


def test_policy_query_prints_allow_or_deny_and_denies_by_default(files):
    """P-8, P-2: ``allow`` with exit 0 when the policy holds the rule, ``deny`` with exit 1
    otherwise; a policy of comments only allows nothing."""
    policy, empty = files / "p", files / "empty"
    policy.write_text("allow coder_t tool:fs.read execute\n")
    empty.write_text("# nothing is allowed here\n\n")
    yes = ctx_run("policy", "query", "--policy", policy, "coder_t", "tool:fs.read", "execute")
    assert (yes.rc, yes.out) == (0, "allow\n"), yes
    no = ctx_run("policy", "query", "--policy", policy, "coder_t", "tool:fs.write", "execute")
    assert (no.rc, no.out) == (1, "deny\n"), no
    none = ctx_run("policy", "query", "--policy", empty, "coder_t", "tool:fs.read", "execute")
    assert (none.rc, none.out) == (1, "deny\n"), none


def test_policy_query_needs_every_given_policy(files):
    """P-6, P-8: with several ``--policy``, every one must allow (the two-layer rule), in
    whatever order they are given."""
    agent, tool = files / "agent", files / "tool"
    agent.write_text("allow coder_t tool:fs.read execute\n")
    tool.write_text("# the tool's own policy, no rule yet\n")
    query = ("coder_t", "tool:fs.read", "execute")
    r = ctx_run("policy", "query", "--policy", tool, "--policy", agent, *query)
    assert (r.rc, r.out) == (1, "deny\n"), r
    tool.write_text("allow coder_t tool:fs.read execute\n")
    for first, second in ((agent, tool), (tool, agent)):
        r = ctx_run("policy", "query", "--policy", first, "--policy", second, *query)
        assert (r.rc, r.out) == (0, "allow\n"), r


def test_policy_rules_match_exact_names_whatever_their_order(files):
    """P-2, P-7: no priority and no matching but by concrete name: a rule after unrelated
    ones still allows; near names (a prefix, a longer name, another subject or object) do
    not."""
    policy = files / "p"
    policy.write_text(
        "allow other_t tool:fs.read execute\n"
        "allow coder_t tool:fs.rea execute\n"
        "allow coder_t tool:fs.read2 execute\n"
        "allow coder_t agent:review-1 create\n"
        "allow coder_t agent:review-1 start\n"
    )
    base = ("policy", "query", "--policy", policy)
    assert ctx_run(*base, "coder_t", "agent:review-1", "start").out == "allow\n"
    for subject, obj, perm in (
        ("coder_t", "tool:fs.read", "execute"),
        ("coder", "agent:review-1", "create"),
        ("coder_t", "agent:review-2", "create"),
    ):
        r = ctx_run(*base, subject, obj, perm)
        assert (r.rc, r.out) == (1, "deny\n"), r


def test_policy_query_with_a_malformed_policy_or_query_is_exit_2(files):
    """P-8, P-2, P-3: a malformed policy (even one of whose lines holds the rule asked for)
    or a malformed query (a glob, an unknown class or permission) is exit 2 with EINVAL,
    neither allow nor deny."""
    policy, broken = files / "p", files / "broken"
    policy.write_text("allow coder_t tool:fs.read execute\n")
    broken.write_text("allow coder_t tool:fs.read execute\nallow coder_t agent:* create\n")
    cases = [
        (broken, ("coder_t", "tool:fs.read", "execute")),
        (policy, ("coder_t", "agent:*", "create")),
        (policy, ("coder_t", "file:x", "read")),
        (policy, ("coder_t", "tool:fs.read", "read")),
    ]
    for path, query in cases:
        r = ctx_run("policy", "query", "--policy", path, *query)
        assert r.rc == 2, r
        assert "EINVAL" in r.err and r.out.strip() not in ("allow", "deny"), r


# ------------------------------------------------------------------------------ T-8 manifests

_DROP = object()
MCP = {"transport": "stdio", "config": "/etc/mcp.json", "server": "s", "tool": "t"}
BAD_MANIFESTS = {
    "version-1": {"manifest": 1},
    "kind-agent": {"kind": "agent"},
    "name-slash": {"name": "a/b"},
    "name-dot-d": {"name": "x.d"},
    "name-dot": {"name": ".x"},
    "name-65": {"name": "a" * 65},
    "exec-and-mcp": {"mcp": MCP},
    "no-exec": {"exec": _DROP},
    "no-description": {"description": _DROP},
    "no-schema": {"schema": _DROP},
    "schema-list": {"schema": []},
    "no-cap": {"cap": _DROP},
    "cap-list": {"cap": []},
    "cap-not-bool": {"cap": {"side_effects": "no", "network": False}},
}


def manifest(**fields) -> dict:
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "demo.tool",
        "description": "A demo tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": "demo.sh",
    }
    for key, value in fields.items():
        if value is _DROP:
            document.pop(key)
        else:
            document[key] = value
    return document


def test_object_check_accepts_a_v2_manifest_and_a_64_byte_name(files):
    """T-8, R-3: a v2 manifest is valid (exit 0); a name of 64 bytes is an object name."""
    (files / "demo.sh").write_text("#!/bin/sh\necho hi\n")
    (files / "a.json").write_text(json.dumps(manifest()))
    (files / "b.json").write_text(json.dumps(manifest(name="a" * 64)))
    checked = ctx_run("object", "check", files / "a.json", files / "b.json")
    assert checked.rc == 0, checked


def test_object_check_refuses_what_is_not_a_v2_manifest(files):
    """T-8, R-3: a v2 manifest is one JSON object ``{"manifest": 2, "kind": "tool", name,
    description, schema, cap, exec | mcp}`` with a legal object name, an object schema and
    boolean cap facts; every other file is refused, with EINVAL."""
    (files / "demo.sh").write_text("#!/bin/sh\necho hi\n")
    paths = []
    for tag, fields in BAD_MANIFESTS.items():
        paths.append(files / f"{tag}.json")
        paths[-1].write_text(json.dumps(manifest(**fields)))
    for tag, text in (("not-json", "not json"), ("array", "[]"), ("two", "{}{}")):
        paths.append(files / f"{tag}.json")
        paths[-1].write_text(text)
    checked = ctx_run("object", "check", *paths)
    assert checked.rc != 0, checked
    for path in paths:
        alone = [line for line in checked.err.splitlines() if line.startswith(f"{path}:")]
        assert alone and all("EINVAL" in line for line in alone), (path, checked)


# ------------------------------------------------------------------------------ T-1, T-8, T-8a


def test_install_into_the_system_tier_makes_the_tool_and_its_controls(world):
    """T-1, T-8: ``tool/<name>`` executable plus ``tool/<name>.d/`` with name, description,
    schema, cap, policy, status, log, hooks/pre.d/, hooks/post.d/; the controls carry the
    manifest's facts and the tool's policy grants nothing."""
    world.install("demo.tool", "#!/bin/sh\necho hi\n")
    exe = world.storage / "tool" / "demo.tool"
    controls = world.storage / "tool" / "demo.tool.d"
    assert exe.is_file() and os.access(exe, os.X_OK)
    for name in T1_FILES:
        assert (controls / name).is_file(), name
    assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
    assert (controls / "name").read_text().strip() == "demo.tool"
    assert (controls / "description").read_text().strip() == "The demo.tool test tool."
    assert json.loads((controls / "schema").read_text()) == {"type": "object"}
    assert json.loads((controls / "cap").read_text()) == {"side_effects": False, "network": False}
    assert rules_of(controls / "policy") == []


def test_install_into_user_and_shared_tiers_with_source(world):
    """T-8, R-4: ``ctx object install --source STORAGE MANIFEST --tier user|shared:<name>``
    puts the tool in ``home/<uid>/tool/`` and ``shared/<name>/tool/`` of the root that
    ``--source`` names, not in the one ``CTX_STORAGE`` names."""
    other = world.top / "elsewhere"
    other.mkdir()
    env = clean_env(CTX_STORAGE=str(other))
    made = world.ctx("shared", "create", "proj")
    assert made.rc == 0, made
    path = tool_manifest(world.top / "manifests", "demo.tool", "#!/bin/sh\necho hi\n")
    for tier, where in (
        ("user", world.storage / "home" / str(os.geteuid()) / "tool"),
        ("shared:proj", world.storage / "shared" / "proj" / "tool"),
    ):
        r = ctx_run("object", "install", "--source", world.storage, path, "--tier", tier, env=env)
        assert r.rc == 0, r
        assert (where / "demo.tool").is_file() and (where / "demo.tool.d" / "policy").is_file()
    assert list(other.iterdir()) == []


def test_install_into_a_tier_that_is_not_one_changes_nothing(world):
    """T-8, R-3: the tiers are ``system``, ``user`` and ``shared:<name>`` (an object name,
    a space that exists); anything else is refused and nothing is installed."""
    before = snapshot(world.storage)
    path = tool_manifest(world.top / "manifests", "demo.tool", "#!/bin/sh\necho hi\n")
    for tier in ("global", "shared:../x", "shared:", "shared:nope"):
        r = world.ctx("object", "install", path, "--tier", tier)
        assert r.rc != 0, r
    assert snapshot(world.storage) == before


def test_list_shows_installed_tools_by_tier(world):
    """T-8a: ``ctx object list [--tier T]`` lists the installed objects, of one tier with
    ``--tier``."""
    assert world.ctx("shared", "create", "proj").rc == 0
    world.install("sys.only", "#!/bin/sh\n")
    world.install("space.only", "#!/bin/sh\n", tier="shared:proj")
    listed = world.ctx("object", "list")
    assert listed.rc == 0, listed
    names = {line.split()[0] for line in listed.lines() if line.strip()}
    assert {"sys.only", "space.only", *CORE_TOOLS} <= names, listed
    space = world.ctx("object", "list", "--tier", "shared:proj")
    names = {line.split()[0] for line in space.lines() if line.strip()}
    assert names == {"space.only"}, space


# ------------------------------------------------------------------------------ T-4, CTX_PATH


@pytest.fixture
def two_dirs(files: Path) -> tuple[Path, Path]:
    """Two directories each holding an executable ``x`` (printing the directory's name) and
    its ``x.d/``."""
    first, second = files / "first", files / "second"
    for d in (first, second):
        d.mkdir()
        (d / "x").write_text(f"#!/bin/sh\necho {d.name}\n")
        (d / "x").chmod(0o755)
        (d / "x.d").mkdir()
    return first, second


def test_which_follows_ctx_path_left_to_right(template, files, two_dirs):
    """T-4, T-8a: ``ctx object which NAME`` prints the path CTX_PATH resolves NAME to: left to
    right, the first directory holding an executable file of that name (a directory that
    does not exist passed over); a non-executable file or a directory of that name is not a
    hit; exit 1 when nothing is."""
    first, second = two_dirs
    env = clean_env(CTX_STORAGE=str(template))

    def which(path: str, name: str = "x") -> Run:
        return ctx_run("object", "which", name, env=dict(env, CTX_PATH=path))

    assert which(f"{files / 'missing'}:{first}:{second}").out == f"{first / 'x'}\n"
    assert which(f"{second}:{first}").out == f"{second / 'x'}\n"
    core = which(f"{template / 'tool'}", "fs.read")
    assert (core.rc, core.out) == (0, f"{template / 'tool' / 'fs.read'}\n"), core
    (first / "x").chmod(0o644)
    assert which(f"{first}:{second}").out == f"{second / 'x'}\n"
    (first / "x").unlink()
    (first / "x").mkdir(mode=0o755)
    assert which(f"{first}:{second}").out == f"{second / 'x'}\n"
    none = which(str(first))
    assert (none.rc, none.out) == (1, ""), none


def test_the_default_search_path_is_the_system_tier_then_the_users(world):
    """T-4, R-4: without ``.tshrc`` or ``CTX_PATH`` the search path is
    ``/ctx/tool:/ctx/home/<uid>/tool`` (the storage root's, when nothing is mounted at
    ``/ctx``): a tool only in the user's tier is found there, and the system tier's of the
    same name comes first."""
    world.install("both", "#!/bin/sh\n", tier="user")
    user = world.storage / "home" / str(os.geteuid()) / "tool" / "both"
    found = world.ctx("object", "which", "both")
    assert found.rc == 0 and found.out.strip() in (str(user), f"/ctx/home/{os.geteuid()}/tool/both")
    world.install("both", "#!/bin/sh\n")
    found = world.ctx("object", "which", "both")
    assert found.rc == 0, found
    assert found.out.strip() in (str(world.storage / "tool" / "both"), "/ctx/tool/both"), found


def test_tshrc_comes_first_and_is_data_never_code(template, files, two_dirs):
    """T-4: for a standalone human, ``CTX_PATH=`` in ``$CTX_HOME/.tshrc`` wins over the
    process ``CTX_PATH``; a ``.tshrc`` without that line leaves the process's in force;
    ``.tshrc`` is data, never code: shell syntax in it runs nothing."""
    first, second = two_dirs
    home = files / "home"
    home.mkdir()
    env = clean_env(CTX_STORAGE=str(template), CTX_HOME=str(home), CTX_PATH=str(first))
    (home / ".tshrc").write_text(f"CTX_PATH={second}\n")
    assert ctx_run("object", "which", "x", env=env).out == f"{second / 'x'}\n"
    (home / ".tshrc").write_text("SOMETHING_ELSE=1\n")
    assert ctx_run("object", "which", "x", env=env).out == f"{first / 'x'}\n"
    hit = files / "tshrc-ran"
    (home / "evil").write_text(f"touch {hit}\n")
    (home / ".tshrc").write_text(f"CTX_PATH=$(touch {hit}){first}\n`touch {hit}`\n. {home}/evil\n")
    ctx_run("object", "which", "x", env=env)
    subprocess.run(
        [str(template / "bin" / "tsh"), "which", "x"], env=env, capture_output=True, timeout=60
    )
    assert not hit.exists()


@needs_root
def test_control_dir_comes_from_the_directory_that_held_the_executable(world):
    """T-4, P-6: the tool's policy consulted is the ``.d/`` beside the executable CTX_PATH
    found: a non-executable ``tool/dup`` whose own policy allows is passed over, and the
    space's ``dup`` runs only once its own ``dup.d/policy`` allows."""
    assert world.ctx("shared", "create", "proj", "--group", "65534").rc == 0
    world.agent("pa", shared={"proj": ["read", "write"]})
    world.install("dup", marker_program(world.out, "system"))
    world.install("dup", marker_program(world.out, "space"), tier="shared:proj")
    world.grant("pa", "dup")  # the agent's policy and tool/dup.d/policy
    (world.storage / "tool" / "dup").chmod(0o644)
    refused = world.ctx("run", "--agent", "pa", "dup")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert names_step(refused.err, 6), refused
    assert not world.ran("space") and not world.ran("system")
    space_policy = world.storage / "shared" / "proj" / "tool" / "dup.d" / "policy"
    with space_policy.open("a") as policy:
        policy.write("allow pa_t tool:dup execute\n")
    ran = world.ctx("run", "--agent", "pa", "dup")
    assert ran.rc == 0, ran
    assert world.ran("space") and not world.ran("system")


# ------------------------------------------------------------------------------ T-2, T-3 runner

ARGV_PROGRAM = """#!/bin/sh
for a in "$@"; do printf '<%s>\\n' "$a"; done
printf 'stdin=%s\\n' "$(cat)"
echo "on stderr" >&2
exit 7
"""


@needs_root
def test_terminal_mode_keeps_argv_stdio_and_exit_status(world):
    """T-3, T-4: terminal CLI mode keeps argv exactly (spaces, empty words, ``--``,
    option-like words), never rejects an empty argv, inherits stdin, stdout and stderr, and
    acts as an ordinary command-line program whose exit status is the tool's.  The
    program is the one of the agent's CTX_PATH, whatever the caller's ``CTX_PATH`` and
    ``.tshrc`` say."""
    world.agent("coder")
    world.install("argv.show", ARGV_PROGRAM)
    world.install("fds", "#!/bin/sh\nreadlink /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2\n")
    world.grant("coder", "argv.show")
    world.grant("coder", "fds")
    fake = world.top / "fake"
    fake.mkdir()
    (fake / "argv.show").write_text(marker_program(world.out, "fake"))
    (fake / "argv.show").chmod(0o755)
    (fake / ".tshrc").write_text(f"CTX_PATH={fake}\n")
    env = dict(world.env, CTX_PATH=str(fake), CTX_HOME=str(fake))
    words = ["a b", "", "--", "-x", "--long=1", '{"path":"x"}']
    r = world.ctx("run", "--agent", "coder", "argv.show", *words, input="piped in", env=env)
    assert r.rc == 7, r
    assert r.out == "".join(f"<{w}>\n" for w in words) + "stdin=piped in\n", r
    assert "on stderr" in r.err, r
    empty = world.ctx("run", "--agent", "coder", "argv.show")
    assert empty.rc == 7 and empty.out == "stdin=\n", empty
    assert not world.ran("fake")
    stdin, stdout, stderr = (world.out / n for n in ("in.txt", "out.txt", "err.txt"))
    stdin.write_text("x\n")
    with stdin.open() as i, stdout.open("w") as o, stderr.open("w") as e:
        done = subprocess.run(
            [*CTX_ARGV, "run", "--agent", "coder", "fds"],
            stdin=i,
            stdout=o,
            stderr=e,
            env=world.env,
            timeout=60,
        )
    assert done.returncode == 0, stderr.read_text()
    assert stdout.read_text().splitlines() == [str(stdin), str(stdout), str(stderr)]


@needs_root
def test_the_core_tools_examples_of_t2(world):
    """T-2: ``fs.read '{"path": …}'`` with its JSON as an argument, and ``shell.exec`` with
    its JSON on stdin (``echo '{"cmd": …}' | shell.exec``)."""
    world.agent("coder", tools=["fs.read", "shell.exec"])
    world.allow_tool("coder_t", "fs.read", "shell.exec")
    read = world.ctx("run", "--agent", "coder", "fs.read", '{"path":"/workspace/a.txt"}')
    assert read.rc == 0 and "hello from the workspace" in read.out, read
    shell = world.ctx("run", "--agent", "coder", "shell.exec", input='{"cmd":"echo hi there"}')
    assert shell.rc == 0 and shell.out == "hi there\n", shell


def find_all(obj) -> list:
    """Every value nested anywhere in ``obj``, JSON texts among them parsed."""
    found = [obj]
    if isinstance(obj, dict):
        for value in obj.values():
            found += find_all(value)
    elif isinstance(obj, list):
        for value in obj:
            found += find_all(value)
    elif isinstance(obj, str):
        with contextlib.suppress(ValueError):
            found.append(json.loads(obj))
    return found


@needs_root
def test_native_mode_json_in_jsonl_frames_out_and_the_same_authorization(world):
    """T-3: agent native mode takes structured JSON input (the tool's stdin) and writes JSONL
    frames, every line of stdout one JSON object; input that is not JSON is refused and
    nothing runs; it goes through the same authorization as terminal mode: without the
    tool's own rule, EACCES and the tool does not run."""
    world.agent("coder")
    world.install("cat.json", "#!/bin/sh\ncat\n")
    world.grant("coder", "cat.json")
    r = world.ctx("run", "--agent", "coder", "--native", "cat.json", input='{"k": [1, 2]}')
    assert r.rc == 0, r
    frames = [json.loads(line) for line in r.lines()]
    assert frames and all(isinstance(f, dict) for f in frames), r
    assert {"k": [1, 2]} in find_all(frames), r
    world.install("mark", marker_program(world.out, "native"))
    world.agent_allows("coder", "mark")
    refused = world.ctx("run", "--agent", "coder", "--native", "mark", input="{}")
    assert refused.rc != 0, refused
    assert all(isinstance(json.loads(line), dict) for line in refused.lines()), refused
    assert "EACCES" in refused.out + refused.err, refused
    world.allow_tool("coder_t", "mark")
    for text in ("not json", "[1, 2"):
        bad = world.ctx("run", "--agent", "coder", "--native", "mark", input=text)
        assert bad.rc != 0, bad
    assert not world.ran("native")


# ------------------------------------------------------------------------------ P-4..P-6 chain


@needs_root
def test_two_layers_refusals_name_steps_5_then_6(world):
    """P-5, P-6, T-8: installing grants nothing; without the agent's rule the refusal is
    EACCES at step 5 (object policy), with it but without the tool's at step 6 (tool
    policy); with both the tool runs.  Each decision is recorded with its step."""
    uid = world.agent("coder")
    world.install("mark", marker_program(world.out, "chain"))
    r5 = world.ctx("run", "--agent", "coder", "mark")
    assert r5.rc != 0 and "EACCES" in r5.err and names_step(r5.err, 5), r5
    world.agent_allows("coder", "mark")
    r6 = world.ctx("run", "--agent", "coder", "mark")
    assert r6.rc != 0 and "EACCES" in r6.err and names_step(r6.err, 6), r6
    assert not world.ran("chain")
    events = read_jsonl(world.session("coder", uid) / "events.jsonl")
    refusals = [e for e in events if e["type"] == "tool_result"]
    assert len(refusals) == 2 and all(e["status"] != "ok" for e in refusals), events
    assert names_step(json.dumps(refusals[0]), 5) and names_step(json.dumps(refusals[1]), 6)
    world.allow_tool("coder_t", "mark")
    ok = world.ctx("run", "--agent", "coder", "mark")
    assert ok.rc == 0 and world.ran("chain"), ok


@needs_root
def test_mode_bits_deny_at_step_2_before_any_policy(world):
    """P-5: the checks run in order and the first denial is the one recorded: a tool the
    agent's uid may not execute is refused at step 2, even when its policies deny too."""
    world.agent("coder")
    world.install("mark", marker_program(world.out, "mode"))
    (world.storage / "tool" / "mark").chmod(0o700)
    r = world.ctx("run", "--agent", "coder", "mark")
    assert r.rc != 0 and "EACCES" in r.err and names_step(r.err, 2), r
    assert not world.ran("mode")


@needs_root
def test_the_subject_is_the_agents_label(world):
    """P-1, P-5 step 4, P-6: the rules are for the agent's label (its subject type): with
    another label in ``agent/<name>.d/label`` the rules for the old one grant nothing, and
    a label that is no subject type at all is refused at step 4."""
    world.agent("coder")
    world.install("mark", marker_program(world.out, "label"))
    world.grant("coder", "mark")
    label = world.storage / "agent" / "coder.d" / "label"
    assert label.read_text().strip() == "coder_t"
    label.write_text("other_t\n")
    other = world.ctx("run", "--agent", "coder", "mark")
    assert other.rc != 0 and "EACCES" in other.err, other
    label.write_text("")
    empty = world.ctx("run", "--agent", "coder", "mark")
    assert empty.rc != 0 and "EACCES" in empty.err and names_step(empty.err, 4), empty
    assert not world.ran("label")


@needs_root
def test_another_uid_cannot_run_a_tool_as_the_agent(world, unprivileged_user):
    """P-5 step 1, H-2: a caller whose credentials are not the host's cannot act with an
    agent's identity: refused with EACCES, the tool does not run."""
    world.agent("coder")
    world.install("mark", marker_program(world.out, "forged"))
    world.grant("coder", "mark")
    done = run_as(
        unprivileged_user,
        [*CTX_ARGV, "run", "--agent", "coder", "mark"],
        env=dict(world.env, HOME=str(world.top)),
        stdin="",
    )
    assert done.returncode != 0, done
    assert "EACCES" in done.stderr or "EPERM" in done.stderr, done
    assert not world.ran("forged")


@needs_root
def test_there_is_no_agent_tool_control_and_prompts_grant_nothing(world):
    """P-6: there is no ``agent/<name>.d/tool``; prompts and system prompts never grant
    permissions: rules written into ``system.md`` or ``prompt.template.md``, or a ``tool``
    control, leave the call refused at step 5."""
    world.agent("coder")
    controls = world.storage / "agent" / "coder.d"
    assert not (controls / "tool").exists()
    world.install("mark", marker_program(world.out, "prompt"))
    world.allow_tool("coder_t", "mark")
    rule = "allow coder_t tool:mark execute\n"
    for name in ("system.md", "prompt.template.md", "tool"):
        with (controls / name).open("a") as control:
            control.write(rule)
    r = world.ctx("run", "--agent", "coder", "mark")
    assert r.rc != 0 and "EACCES" in r.err and names_step(r.err, 5), r
    assert not world.ran("prompt")


@needs_root
def test_a_malformed_policy_in_either_layer_grants_nothing(world):
    """P-2, P-3, P-6: a policy holding an invalid rule (a glob) is invalid: a call it used to
    allow is refused and the tool does not run, whichever layer holds it."""
    world.agent("coder")
    world.install("mark", marker_program(world.out, "broken"))
    world.grant("coder", "mark")
    for path in (
        world.storage / "agent" / "coder.d" / "policy",
        world.storage / "tool" / "mark.d" / "policy",
    ):
        good = path.read_bytes()
        with path.open("a") as policy:
            policy.write("allow coder_t agent:* create\n")
        r = world.ctx("run", "--agent", "coder", "mark")
        assert r.rc != 0, r
        assert not world.ran("broken")
        path.write_bytes(good)
    assert world.ctx("run", "--agent", "coder", "mark").rc == 0
    assert world.ran("broken")


NET_PROGRAM = """#!/bin/sh
exec /usr/bin/python3 -c '
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10).close()
    print("connected")
except OSError:
    print("no network")
' "$@"
"""


@needs_root
def test_network_only_with_network_default_connect(world):
    """P-4: without ``allow X network:default connect`` there is no network access; with it
    a tool of the agent connects."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs /usr/bin/python3 for the probe tool")
    world.agent("coder")
    world.install("net.probe", NET_PROGRAM)
    world.grant("coder", "net.probe")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = str(server.getsockname()[1])
        closed = world.ctx("run", "--agent", "coder", "net.probe", port)
        assert closed.out == "no network\n", closed
        with (world.storage / "agent" / "coder.d" / "policy").open("a") as policy:
            policy.write("allow coder_t network:default connect\n")
        opened = world.ctx("run", "--agent", "coder", "net.probe", port)
        assert opened.out == "connected\n", opened


# ------------------------------------------------------------------------------ T-6 hooks


def hook(world: World, tool: str, phase: str, name: str, body: str) -> Path:
    path = world.storage / "tool" / f"{tool}.d" / "hooks" / f"{phase}.d" / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@needs_root
def test_pre_hooks_in_name_order_may_veto_and_post_hooks_run_after(world):
    """T-6, T-7: executables in ``hooks/pre.d/`` run in name order before the tool, those in
    ``hooks/post.d/`` after it; a pre hook exiting non-zero vetoes the call: neither the
    tool nor later hooks run, and the call is recorded as failed."""
    order = world.out / "order"
    uid = world.agent("coder")
    world.install("hooked", f"#!/bin/sh\necho tool >> {order}\n")
    world.grant("coder", "hooked")
    for name in ("b-second", "a-first", "c-third"):
        hook(world, "hooked", "pre", name, f"echo {name} >> {order}")
    hook(world, "hooked", "post", "z-post", f"echo post >> {order}")
    r = world.ctx("run", "--agent", "coder", "hooked")
    assert r.rc == 0, r
    assert order.read_text().split() == ["a-first", "b-second", "c-third", "tool", "post"]
    order.unlink()
    hook(world, "hooked", "pre", "b-second", f"echo b-veto >> {order}; exit 3")
    vetoed = world.ctx("run", "--agent", "coder", "hooked")
    assert vetoed.rc != 0, vetoed
    assert order.read_text().split() == ["a-first", "b-veto"]
    events = read_jsonl(world.session("coder", uid) / "events.jsonl")
    assert events[-1]["type"] == "tool_result" and events[-1]["status"] != "ok", events


# ------------------------------------------------------------------------------ S-1..S-6, T-7


@needs_root
def test_a_call_is_two_events_and_a_tool_log_line(world):
    """S-1, S-2, S-3, T-7: a call is recorded in
    ``home/<uid>/agent/<agent>/session/<session>/events.jsonl`` as a ``tool_call`` and a
    ``tool_result`` event, each with ts (UTC), type, agent, session, object
    (``tool/<name>``) and status, and in ``tool/<name>.d/log``."""
    uid = world.agent("coder")
    world.install("argv.show", ARGV_PROGRAM.replace("exit 7", "exit 0"))
    world.grant("coder", "argv.show")
    log = world.storage / "tool" / "argv.show.d" / "log"
    before = log.read_bytes()
    assert world.ctx("run", "--agent", "coder", "argv.show", "x").rc == 0
    events = read_jsonl(world.session("coder", uid) / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    for event in events:
        assert set(S2_KEYS) <= set(event), event
        assert event["ts"].endswith("Z") and rfc3339(event["ts"]).utcoffset().total_seconds() == 0
        assert (event["agent"], event["session"]) == ("coder", "default"), event
        assert event["object"] == "tool/argv.show", event
    assert events[-1]["status"] == "ok", events
    after = log.read_bytes()
    assert after.startswith(before) and len(after) > len(before)
    assert all(json.loads(line) for line in after[len(before) :].decode().splitlines())


@needs_root
def test_named_and_shared_sessions_are_ordinary_directories(world):
    """S-1, S-6: ``--session S`` records in ``home/<uid>/agent/<a>/session/S/``; a session
    of shared space P in ``shared/P/agent/<a>/session/S/``, each with ``events.jsonl``; an
    agent granted only ``shared:P read`` is refused (EACCES) a session there, none appears
    and its tool does not run."""
    assert world.ctx("shared", "create", "proj", "--group", "65534").rc == 0
    uid = world.agent("pa", shared={"proj": ["read", "write"]})
    world.agent("reader", shared={"proj": ["read"]})
    world.install("mark", marker_program(world.out, "shared"))
    world.grant("pa", "mark")
    world.grant("reader", "mark")
    assert world.ctx("run", "--agent", "pa", "--session", "review", "mark").rc == 0
    home = world.session("pa", uid, "review") / "events.jsonl"
    assert [e["session"] for e in read_jsonl(home)] == ["review", "review"]
    r = world.ctx("run", "--agent", "pa", "--project", "proj", "--session", "review", "mark")
    assert r.rc == 0, r
    agents = world.storage / "shared" / "proj" / "agent"
    shared = agents / "pa" / "session" / "review" / "events.jsonl"
    assert [e["type"] for e in read_jsonl(shared)] == ["tool_call", "tool_result"]
    (world.out / "ran-shared").unlink()
    refused = world.ctx("run", "--agent", "reader", "--project", "proj", "mark")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert not (agents / "reader").exists()
    assert not world.ran("shared")


@needs_root
@needs_fuse_as_root
def test_a_shared_session_is_writable_only_with_the_session_permission(world):
    """S-6, F-1: a shared session is writable to an agent only when Linux permissions, mount
    visibility and policy v0 all allow it (``session:<name> read|write|resume``).  Agent
    ``pa`` holds ``shared:proj read`` and ``write`` but no ``session:`` rule: through its
    mounted view, as its uid, appending to its session ``review`` or making a session
    ``other`` is refused."""
    assert world.ctx("shared", "create", "proj", "--group", "65534").rc == 0
    uid = world.agent("pa", shared={"proj": ["read", "write"]})
    world.install("quiet", "#!/bin/sh\n")
    world.grant("pa", "quiet")
    r = world.ctx("run", "--agent", "pa", "--project", "proj", "--session", "review", "quiet")
    assert r.rc == 0, r
    sessions = world.storage / "shared" / "proj" / "agent" / "pa" / "session"
    before = (sessions / "review" / "events.jsonl").read_bytes()
    mountpoint = world.top / "mnt"
    with ctx_mount(world.storage, mountpoint, "--as", "pa"):
        seen = mountpoint / "shared" / "proj" / "agent" / "pa" / "session"
        script = (
            f'printf "{{}}\\n" >> {seen}/review/events.jsonl; a=$?; '
            f"mkdir {seen}/other; m=$?; echo $a $m"
        )
        done = subprocess.run(
            ["/bin/sh", "-c", script],
            user=uid,
            group=uid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )
    append_status, mkdir_status = done.stdout.split()
    assert append_status != "0", done
    assert mkdir_status != "0", done
    assert (sessions / "review" / "events.jsonl").read_bytes() == before
    assert not (sessions / "other").exists()


@needs_root
def test_an_illegal_session_name_is_einval_and_records_nothing(world):
    """R-3, S-1: a session name is an object name; anything else is EINVAL, nothing runs and
    no session directory is made."""
    uid = world.agent("coder")
    world.install("mark", marker_program(world.out, "session"))
    world.grant("coder", "mark")
    for session in ("a/b", "..", "x.d", "a" * 65):
        r = world.ctx("run", "--agent", "coder", "--session", session, "mark")
        assert r.rc != 0 and "EINVAL" in r.err, r
    assert not world.ran("session")
    assert not world.session("coder", uid).parent.exists()


@needs_root
def test_a_torn_last_line_is_ignored_by_readers_and_cut_by_repair(world):
    """S-5: readers ignore a torn last line and ``ctx session repair`` truncates it, leaving
    the complete lines as they were; later appends stay one event per line."""
    uid = world.agent("coder")
    world.install("quiet", "#!/bin/sh\n")
    world.grant("coder", "quiet")
    assert world.ctx("run", "--agent", "coder", "quiet").rc == 0
    events = world.session("coder", uid) / "events.jsonl"
    whole = events.read_bytes()
    with events.open("ab") as f:
        f.write(b'{"ts":"2026-06-22T12:00:00Z","type":"tool_ca')
    shown = world.ctx("session", "show", "coder", "--json")
    assert shown.rc == 0, shown
    complete = [json.loads(line) for line in whole.decode().splitlines()]
    assert [json.loads(line) for line in shown.lines()] == complete, shown
    repaired = world.ctx("session", "repair", "coder")
    assert repaired.rc == 0, repaired
    assert events.read_bytes() == whole
    assert world.ctx("run", "--agent", "coder", "quiet").rc == 0
    assert len(read_jsonl(events)) == 4


@needs_root
def test_concurrent_calls_never_interleave_inside_a_line(world):
    """S-5: concurrent appenders to one session never interleave inside a line: every line
    is one event and none is lost."""
    uid = world.agent("coder")
    world.install("quiet", "#!/bin/sh\n")
    world.grant("coder", "quiet")
    argv = [*CTX_ARGV, "run", "--agent", "coder", "--session", "busy", "quiet"]
    procs = [
        subprocess.Popen(argv, env=world.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(5)
    ]
    for proc in procs:
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    raw = (world.session("coder", uid, "busy") / "events.jsonl").read_text()
    assert raw.endswith("\n")
    types = [json.loads(line)["type"] for line in raw.splitlines()]
    assert sorted(types) == ["tool_call"] * 5 + ["tool_result"] * 5


@needs_root
def test_a_long_input_is_not_recorded_whole(world):
    """S-4: by default logs record facts and errors, not long prompts: a 200 000-byte input
    does not reach ``events.jsonl`` or the tool's log whole."""
    uid = world.agent("coder")
    world.install("quiet", "#!/bin/sh\ncat > /dev/null\necho done\n")
    world.grant("coder", "quiet")
    prompt = "P" * 200_000
    r = world.ctx(
        "run", "--agent", "coder", "--native", "quiet", input=json.dumps({"prompt": prompt})
    )
    assert r.rc == 0, r
    assert world.ctx("run", "--agent", "coder", "quiet", prompt[:100_000]).rc == 0
    for path in (
        world.session("coder", uid) / "events.jsonl",
        world.storage / "tool" / "quiet.d" / "log",
    ):
        assert "P" * 100_000 not in path.read_text(), path


@needs_root
def test_a_call_leaves_only_its_session_and_logs(world):
    """T-5, S-3, R-2: authorization creates no persistent copy: after calls allowed and
    refused, what changed is the session and the tools' logs (kept with their objects, none
    at the root); the root still holds exactly its six entries."""
    uid = world.agent("coder")
    world.install("quiet", "#!/bin/sh\n")
    world.grant("coder", "quiet")
    world.install("denied", "#!/bin/sh\n")
    before = snapshot(world.storage)
    assert world.ctx("run", "--agent", "coder", "quiet").rc == 0
    assert world.ctx("run", "--agent", "coder", "denied").rc != 0
    assert world.ctx("run", "--agent", "coder", "--native", "quiet", input="{}").rc == 0
    after = snapshot(world.storage)
    session = f"home/{uid}/agent/coder/session/default"
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    allowed = {"tool/quiet.d/log", "tool/denied.d/log", f"{session}/events.jsonl"}
    homes = {"/".join(session.split("/")[:i]) for i in range(2, 7)}
    assert changed - allowed - homes == set(), changed
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES


# ------------------------------------------------------------------------------


def test_bootstrap_makes_the_root_abi_core_tools_and_terminal_objects(template):
    """R-2, R-5, T-1, H-1, H-4: exactly the six root entries; the core tools with their
    controls; ``bin/tsh``, ``bin/ctxterm`` and ``tool/tsh`` executables; and
    ``tool/tsh.d/config`` holding the three settings at their defaults."""
    assert set(os.listdir(template)) == ROOT_ENTRIES
    for tool in CORE_TOOLS:
        assert os.access(template / "tool" / tool, os.X_OK), tool
        for name in T1_FILES:
            assert (template / "tool" / f"{tool}.d" / name).is_file(), (tool, name)
        for phase in ("pre.d", "post.d"):
            assert (template / "tool" / f"{tool}.d" / "hooks" / phase).is_dir(), tool
    for path in ("bin/tsh", "bin/ctxterm", "tool/tsh"):
        assert (template / path).is_file() and os.access(template / path, os.X_OK), path
    config = (template / "tool" / "tsh.d" / "config").read_text()
    assert key_values(config) == TSH_DEFAULTS


def test_storage_option_overrides_ctx_storage(template, files):
    """R-1: ``CTX_STORAGE`` chooses the storage root and ``--storage DIR`` overrides it."""
    env = clean_env(CTX_STORAGE=str(files), CTX_PATH="/ctx/tool")
    r = ctx_run("--storage", template, "object", "which", "fs.read", env=env)
    assert (r.rc, r.out) == (0, f"{template / 'tool' / 'fs.read'}\n"), r
    env = clean_env(CTX_STORAGE=str(template), CTX_PATH="/ctx/tool")
    r = ctx_run("object", "which", "fs.read", env=env)
    assert (r.rc, r.out) == (0, f"{template / 'tool' / 'fs.read'}\n"), r


@needs_root
def test_a_non_root_users_default_storage_root(world, unprivileged_user):
    """R-1: for a non-root user without configuration the storage root is
    ``$XDG_DATA_HOME/cortexfs/storage/current``, ``~/.local/share/…`` when it is unset;
    ``CTX_STORAGE`` overrides it."""
    home = world.top / "userhome"
    home.mkdir()
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    default = home / ".local" / "share" / "cortexfs" / "storage" / "current"
    xdg = home / "xdg"
    for env, root in (
        (base, default),
        (dict(base, XDG_DATA_HOME=str(xdg)), xdg / "cortexfs" / "storage" / "current"),
        (dict(base, XDG_DATA_HOME=str(xdg), CTX_STORAGE=str(world.storage)), world.storage),
    ):
        found = run_as(unprivileged_user, [*CTX_ARGV, "object", "which", "fs.read"], env=env)
        said = found.stdout + found.stderr
        assert str(root) in said, found
        assert root == default or str(default) not in said, found


def test_bootstrap_again_keeps_what_the_administrator_changed(world):
    """R-5: bootstrap is idempotent and never destroys user data: a rule added to a core
    tool's policy, a changed tsh setting and an installed tool survive a second run."""
    world.install("mine", "#!/bin/sh\n")
    policy = world.storage / "tool" / "fs.read.d" / "policy"
    with policy.open("a") as f:
        f.write("allow coder_t tool:fs.read execute\n")
    config = world.storage / "tool" / "tsh.d" / "config"
    config.write_text(config.read_text().replace("cache_capacity=32", "cache_capacity=48"))
    policy_before = policy.read_bytes()
    again = world.ctx("bootstrap")
    assert again.rc == 0, again
    assert policy.read_bytes() == policy_before
    assert key_values(config.read_text())["cache_capacity"] == "48"
    assert (world.storage / "tool" / "mine").is_file()


# ------------------------------------------------------------------------------ H-1..H-4


def test_ctx_tool_tsh_config_shows_updates_and_refuses_bad_values(world):
    """H-3, H-4: ``ctx tool tsh.config`` runs the safe core CLI: it shows the three settings
    (defaults 64, 32, 1) and updates one, the file staying data with its comments kept; a
    value that is not a number is refused and the file is left as it was."""
    config = world.storage / "tool" / "tsh.d" / "config"
    comments = [line for line in config.read_text().splitlines() if line.startswith("#")]
    shown = world.ctx("tool", "tsh.config")
    assert shown.rc == 0 and key_values(shown.out) == TSH_DEFAULTS, shown
    updated = world.ctx("tool", "tsh.config", "cache_capacity=64")
    assert updated.rc == 0, updated
    assert key_values(config.read_text()) == dict(TSH_DEFAULTS, cache_capacity="64")
    assert [ln for ln in config.read_text().splitlines() if ln.startswith("#")] == comments
    before = config.read_bytes()
    for word in ("cache_capacity=abc", "max_loaded_tools=$(id)"):
        r = world.ctx("tool", "tsh.config", word)
        assert r.rc != 0, r
    assert config.read_bytes() == before


def test_tsh_config_is_data_never_code(world):
    """H-4: ``tool/tsh.d/config`` is data: blank lines and ``#`` comments are allowed and
    nothing in it is run."""
    hit = world.out / "config-ran"
    config = world.storage / "tool" / "tsh.d" / "config"
    config.write_text(
        f"\n# comment\n   \nmax_loaded_tools=$(touch {hit})\n`touch {hit}`\ncache_capacity=7\n"
    )
    shown = world.ctx("tool", "tsh.config")
    tsh(world, "help")
    assert not hit.exists()
    assert key_values(shown.out).get("cache_capacity") == "7", shown


def test_ctx_tool_refuses_ordinary_and_permission_bearing_tools(world):
    """H-3: ``ctx tool`` must refuse ordinary visible tools and permission-bearing core
    tools (``fs.write``, ``shell.exec``); nothing runs."""
    world.install("ordinary", marker_program(world.out, "ordinary"))
    env = dict(world.env, CTX_PATH=str(world.storage / "tool"))
    target = world.out / "written"
    arg = json.dumps({"path": str(target), "content": "x", "cmd": f"touch {target}"})
    for name in ("fs.write", "shell.exec", "ordinary"):
        r = ctx_run("tool", name, arg, env=env, input=arg)
        assert r.rc != 0 and "EACCES" in r.err, r
    assert not world.ran("ordinary") and not target.exists()


def test_ctx_tool_needs_the_name_visible_on_ctx_path(world):
    """H-3: NAME must still be visible on CTX_PATH: not on it, ``ctx tool tsh.config`` is
    refused; when the first hit is a program of the user's own of that name, that program is
    not run."""
    empty = world.top / "empty"
    empty.mkdir()
    r = world.ctx("tool", "tsh.config", env=dict(world.env, CTX_PATH=str(empty)))
    assert r.rc != 0, r
    (empty / "tsh.config").write_text(marker_program(world.out, "own"))
    (empty / "tsh.config").chmod(0o755)
    path = f"{empty}:{world.storage / 'tool'}"
    r = world.ctx("tool", "tsh.config", env=dict(world.env, CTX_PATH=path))
    assert not world.ran("own"), r


def tsh(world: World, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
    """A standalone human tsh of the world's root, its CTX_PATH the root's ``tool/``."""
    environment = dict(world.env, CTX_PATH=str(world.storage / "tool"), **env)
    return subprocess.run(
        [str(world.storage / "bin" / "tsh"), *args],
        input=stdin,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_standalone_tsh_discovers_tools_but_runs_none_and_no_host_command(world):
    """H-1, H-2: a standalone human tsh can discover tools and read their metadata, but
    cannot execute tools as an agent, not even with agent-looking variables in its
    environment; it never runs host commands from ``PATH``."""
    world.install("mark", marker_program(world.out, "tsh"))
    found = tsh(world, "which", "mark")
    assert found.returncode == 0
    assert found.stdout.strip() == str(world.storage / "tool" / "mark"), found
    described = tsh(world, "describe", "mark")
    assert described.returncode == 0 and "The mark test tool." in described.stdout, described
    forged = {"CTX_AGENT": "coder", "CTX_SESSION": "default", "CTX_MODE": "terminal"}
    assert tsh(world, "mark").returncode != 0
    assert tsh(world, stdin="mark\n", **forged).returncode != 0
    assert not world.ran("tsh")
    bindir = world.top / "hostbin"
    bindir.mkdir()
    (bindir / "hostcmd").write_text(marker_program(world.out, "host"))
    (bindir / "hostcmd").chmod(0o755)
    path = f"{bindir}:/usr/bin:/bin"
    assert tsh(world, "which", "hostcmd", PATH=path).returncode != 0
    assert tsh(world, stdin="hostcmd\nsh -c hostcmd\n", PATH=path).returncode != 0
    assert not world.ran("host")


def test_max_loaded_tools_bounds_unpinned_tools_and_pinned_stay(world):
    """H-4: ``max_loaded_tools`` bounds the unpinned tool metadata loaded into the tsh
    context; pinned tools are exempt from unload."""
    config = world.storage / "tool" / "tsh.d" / "config"
    config.write_text("max_loaded_tools=2\ncache_capacity=32\nwindow_percent=1\n")
    script = (
        "pin fs.read\nload fs.list\nload fs.stat\nload fs.write\nload shell.exec\n"
        "which fs.read\nloaded\n"
    )
    done = tsh(world, stdin=script)
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    marker = lines.index(str(world.storage / "tool" / "fs.read"))
    loaded = [line.split(":")[0].strip() for line in lines[marker + 1 :] if line.strip()]
    assert "fs.read" in loaded, done
    others = [name for name in loaded if name != "fs.read"]
    assert 1 <= len(others) <= 2, done
    assert set(others) <= {"fs.list", "fs.stat", "fs.write", "shell.exec"}, done
