"""End-to-end flows of a user who has read only SPEC §0, §1 and §9-§14 and does what their
letter says: ``ctxmcp project`` with the very command line of M-1 (``--runtime-config
/workspace/.mcp.json``) while ``/ctx`` is mounted, servers named ``github`` and ``figma``
whose ``/ctx/mcp/...`` R-2 says must not exist, the policy line M-4 prints pasted as it
stands, a ``program`` control (C-2) edited through the host's view while an agent's view is
up, every spelling of a manual topic D-1 names, ``ctx bootstrap`` repairing what was deleted
through a live mount (R-5), and ``ctx mount MOUNTPOINT [--as AGENT]`` in SPEC's own order.

The MCP servers are the small scripted stdio server of test_acceptance_mcp.py, run as the
agent's uid by the installed bridge.  Black-box: the installed ``ctx`` and ``ctxmcp``, real
processes, uids and FUSE mounts; nothing of the product is imported."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    MAN_PAGES,
    MOUNT_WAIT,
    REPO,
    ROOT_ENTRIES,
    OnStorage,
    Run,
    clean_env,
    ctx_mount,
    ctx_run,
    mounted_at,
    needs_fuse,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
    write_durably,
)
from tests.acceptance.test_acceptance_mcp import SCRIPTED_SERVER
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
RUNTIME = "/workspace/.mcp.json"  # M-1's own example of --runtime-config
SEARCH = {
    "name": "search_issues",
    "description": "Search the issues of a repository.",
    "inputSchema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}
GET_FILE = {
    "name": "get_file",
    "description": "Fetch a design file.",
    "inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}},
}
GITHUB_TOOL = "github.search_issues"
FIGMA_TOOL = "figma.get_file"
# M-4, verbatim: "allow coder_t tool:github.search_issues execute".
SPEC_RULE = "allow coder_t tool:github.search_issues execute"
# C-2's example of a success-result schema, made stricter: it wants {"sum": integer} only.
RESULT_SCHEMA = {
    "type": "object",
    "properties": {"sum": {"type": "integer"}},
    "required": ["sum"],
    "additionalProperties": False,
}
# A tool whose output is what neither its input schema nor its program's result schema
# describes: while programmatic tool calling is off, neither is checked against an output.
PRODUCT_TOOL = """#!/bin/sh
cat >/dev/null
printf '{"product": 6}\\n'
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: root")
needs_ctxmcp = pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed")


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Desk(OnStorage):
    """A directory every uid may search, holding a bootstrapped storage root, ``cfg/`` (the
    host-owned directory with ``.mcp.json`` naming servers ``github`` and ``figma``, which
    agents may see read-only at ``/workspace``) and ``records/`` (where each server writes
    every message it receives, one file per server)."""

    top: Path
    storage: Path

    @property
    def cfg(self) -> Path:
        return self.top / "cfg"

    @property
    def config(self) -> Path:
        return self.cfg / ".mcp.json"

    def record(self, server: str) -> Path:
        return self.top / "records" / f"{server}.jsonl"

    def received(self, server: str) -> list[dict]:
        path = self.record(server)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def ctxmcp(self, *args: str | os.PathLike) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              timeout=90, env=self.env)  # fmt: skip

    def project(self, server: str, out: Path) -> subprocess.CompletedProcess:
        """M-1's second command line, word for word."""
        return self.ctxmcp(
            "project", "--config", self.config, "--runtime-config", RUNTIME,
            "--server", server, "--out", out,
        )  # fmt: skip

    def adopt(self, server: str) -> Path:
        """Project ``server`` into a scratch directory, check its candidate and install it in
        the system tier; the candidate."""
        out = self.top / "candidates"
        done = self.project(server, out)
        assert done.returncode == 0, done
        (candidate,) = out.glob(f"{server}.*.manifest.json")
        checked = self.ctx("object", "check", candidate)
        assert checked.rc == 0, checked
        installed = self.ctx("object", "install", candidate, "--tier", "system")
        assert installed.rc == 0, installed
        self.record(server).unlink()  # what ctxmcp said to the server: not a call
        return candidate

    def agent(self, name: str, tools: list[str], mounts: list[list[str]]) -> int:
        req = {"name": name, "label": f"{name}_t", "tools": tools, "mount": mounts}
        made = self.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        assert made.rc == 0, made
        return made.json()["identity"]["uid"]

    def grant(self, rule: str, *policies: Path) -> None:
        for policy in policies:
            with policy.open("a") as file:
                file.write(rule + "\n")

    def native(self, agent: str, tool: str, payload: dict) -> tuple[Run, dict]:
        ran = self.ctx("run", "--agent", agent, "--native", tool, input=json.dumps(payload),
                       timeout=90)  # fmt: skip
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return ran, frames[-1]

    def status(self, tool: str) -> str | None:
        listed = self.ctx("object", "list", "--json")
        assert listed.rc == 0, listed
        return next((t["status"] for t in listed.json() if t["name"] == tool), None)


@pytest.fixture
def desk(_template: Path) -> Iterator[Desk]:
    top = new_scratch_dir(SCRATCH, "desk-")
    try:
        storage = copy_of_root(_template, top / "storage")
        desk = Desk(top, storage)
        desk.cfg.mkdir(mode=0o755)
        (top / "records").mkdir()
        (top / "records").chmod(0o777)  # the servers run as the agents' uids
        server = desk.cfg / "scripted_server.py"
        server.write_text(SCRIPTED_SERVER)
        server.chmod(0o644)
        servers = {}
        for name, tools in (("github", [SEARCH]), ("figma", [GET_FILE])):
            script = desk.cfg / f"{name}.script.json"
            script.write_text(json.dumps({"tools": tools, "record": str(desk.record(name))}))
            script.chmod(0o644)
            servers[name] = {"command": sys.executable, "args": [str(server), str(script)]}
        desk.config.write_text(json.dumps({"mcpServers": servers}))
        desk.config.chmod(0o644)
        yield desk
    finally:
        shutil.rmtree(top, ignore_errors=True)


def errno_of(action) -> str | None:
    """The errno name ``action()`` fails with, or None when it succeeds."""
    try:
        action()
    except OSError as failure:
        return errno.errorcode[failure.errno]
    return None


def all_names(top: Path) -> set[str]:
    return {name for _dir, dirs, files in os.walk(top) for name in dirs + files}


# ========================================================= M-1, M-3, R-2 with /ctx mounted


@needs_root
@needs_ctxmcp
@needs_fuse
def test_candidates_never_land_in_a_live_mount_and_github_and_figma_never_appear_under_mcp(
    desk: Desk,
) -> None:
    """M-1 "writes nothing under /ctx" while the storage root is mounted (the host's view and
    an agent's): ``--out`` anywhere in either mount is EINVAL, exit 2, nothing written.  Then
    the candidates, projected elsewhere and installed (M-3: exactly ``github.search_issues``
    and ``figma.get_file``, no ``mcp.`` prefix), show as ordinary tools under ``tool/``
    while R-2's ``/ctx/mcp/github`` and ``/ctx/mcp/figma`` do not exist in either view, and
    nothing was granted (M-1: the agent's view does not list them)."""
    desk.agent("coder", [], [[str(desk.cfg), "/workspace", "ro"]])
    host, view = desk.top / "ctx", desk.top / "coder-ctx"
    with ctx_mount(desk.storage, host), ctx_mount(desk.storage, view, "--as", "coder"):
        before = snapshot(desk.storage)
        outs = [host / "shared" / "proj" / "data" / "candidates", host / "mcp" / "github",
                view / "home"]  # fmt: skip
        for out in outs:
            refused = desk.project("github", out)
            assert refused.returncode == 2, (out, refused)
            assert refused.stderr.startswith("ctxmcp: EINVAL: "), refused.stderr
            assert "nothing was written" in refused.stderr, refused.stderr
        assert snapshot(desk.storage) == before
        assert desk.received("github") == []  # refused before any server was started

        github = desk.adopt("github")
        figma = desk.adopt("figma")
        assert json.loads(github.read_text())["name"] == GITHUB_TOOL
        assert json.loads(figma.read_text())["name"] == FIGMA_TOOL

        for tool in (GITHUB_TOOL, FIGMA_TOOL):
            assert os.access(host / "tool" / tool, os.X_OK), tool
            assert (host / "tool" / f"{tool}.d" / "mcp").is_file(), tool
            assert errno_of(lambda t=tool: os.stat(host / "tool" / f"mcp.{t}")) == "ENOENT"
            assert errno_of(lambda t=tool: os.stat(view / "tool" / t)) == "ENOENT"  # no grant
        for where in (host, view):
            assert set(os.listdir(where)) <= ROOT_ENTRIES
            for path in ("mcp", "mcp/github", "mcp/figma"):
                assert errno_of(lambda p=path, w=where: os.stat(w / p)) == "ENOENT", (where, path)
        assert set(os.listdir(host)) == ROOT_ENTRIES
        assert errno_of(lambda: os.mkdir(host / "mcp")) == "EACCES"
        assert errno_of(lambda: os.makedirs(host / "mcp" / "github")) == "EACCES"
    assert set(os.listdir(desk.storage)) == ROOT_ENTRIES
    assert "audit" not in all_names(desk.storage)


# ============================================================ M-4, C-1: the rule as printed


@needs_root
@needs_ctxmcp
@needs_fuse
def test_the_rule_m4_prints_pasted_verbatim_lets_coder_see_and_call_github_search_issues(
    desk: Desk,
) -> None:
    """M-4: a projected tool is an ordinary tool under the ordinary ``tool`` class: the line
    SPEC prints, ``allow coder_t tool:github.search_issues execute``, pasted into the agent's
    policy and the tool's own, is valid policy v0 and is all it takes for coder to see the
    tool in its mounted view (F-1) and call it, the server reading the config at M-1's
    ``/workspace/.mcp.json`` as coder sees it; before it, nothing is granted and no server
    starts.  §0: the call is recorded next to the tool and the session, never in an ``audit/``;
    C-1: nothing of programmatic tool calling is announced anywhere."""
    desk.adopt("github")
    uid = desk.agent("coder", [], [[str(desk.cfg), "/workspace", "ro"]])
    agent_policy = desk.storage / "agent" / "coder.d" / "policy"
    controls = desk.storage / "tool" / f"{GITHUB_TOOL}.d"
    log_before = (controls / "log").read_bytes()
    view = desk.top / "coder-ctx"
    with ctx_mount(desk.storage, view, "--as", "coder"):
        explained = desk.ctx("policy", "explain", "coder", f"tool:{GITHUB_TOOL}", "execute")
        assert explained.rc == 1, explained
        assert GITHUB_TOOL not in os.listdir(view / "tool")
        refused, result = desk.native("coder", GITHUB_TOOL, {"query": "flaky"})
        assert refused.rc != 0 and result["status"] != "ok", refused
        assert "EACCES" in json.dumps(result), result
        assert desk.received("github") == []

        desk.grant(SPEC_RULE, agent_policy, controls / "policy")
        checked = desk.ctx("policy", "check", agent_policy, controls / "policy")
        assert checked.rc == 0, checked
        explained = desk.ctx("policy", "explain", "coder", f"tool:{GITHUB_TOOL}", "execute")
        assert explained.rc == 0, explained
        assert wait_for(lambda: GITHUB_TOOL in os.listdir(view / "tool"), 5), "not shown"
        seen_schema = json.loads((view / "tool" / f"{GITHUB_TOOL}.d" / "schema").read_text())
        assert seen_schema == SEARCH["inputSchema"]  # C-1: the input schema, nothing else
        assert "programmatic_tool_calling" not in os.listdir(view / "tool")

        ran, result = desk.native("coder", GITHUB_TOOL, {"query": "flaky test"})
        assert ran.rc == 0 and result["status"] == "ok", ran
        assert "flaky test" in json.dumps(result["output"]), result
        # C-1: no programmatic_tool_calling tool to call, whatever the policy says
        desk.grant("allow coder_t tool:programmatic_tool_calling execute", agent_policy)
        absent, result = desk.native("coder", "programmatic_tool_calling", {"code": "1"})
        assert absent.rc != 0 and result["status"] != "ok", absent
        assert "ENOENT" in json.dumps(result), result

    messages = desk.received("github")
    initialize = next(m for m in messages if m.get("method") == "initialize")
    assert initialize["params"]["protocolVersion"] == "2025-11-25"  # M-2
    (call,) = [m for m in messages if m.get("method") == "tools/call"]
    assert call["params"]["name"] == "search_issues"  # the remote name: no prefix (M-3)
    assert call["params"]["arguments"] == {"query": "flaky test"}
    sent = json.dumps(messages)
    for word in ("programmatic", "allowed_callers", "outputSchema", "output_schema"):
        assert word not in sent, word

    # §0: logs and events live next to the object they describe
    assert len((controls / "log").read_bytes()) > len(log_before)
    sessions = list((desk.storage / "home" / str(uid) / "agent" / "coder" / "session").glob(
        "*/events.jsonl"))  # fmt: skip
    recorded = [json.loads(line) for path in sessions for line in path.read_text().splitlines()]
    results = [e for e in recorded if e.get("type") == "tool_result"]
    assert any(GITHUB_TOOL in json.dumps(e) for e in results), recorded
    assert set(os.listdir(desk.storage)) == ROOT_ENTRIES
    assert "audit" not in all_names(desk.storage)


@needs_root
@needs_ctxmcp
def test_a_runtime_config_outside_the_agents_mounts_starts_no_server(desk: Desk) -> None:
    """M-4: the locator holds "the visible absolute config path": visible to the agent.  The
    same projected tool, granted by M-4's rule to an agent whose mounts show nothing at
    ``/workspace``, is refused with EACCES naming that path, and the server never starts:
    the host's file at another path is not what the agent sees.  A second agent that sees the
    same file at ``/workspace`` read-only calls it."""
    desk.adopt("github")
    desk.agent("ghost", [], [[str(desk.top / "records"), "/data", "ro"]])
    desk.agent("coder", [], [[str(desk.cfg), "/workspace", "ro"]])
    controls = desk.storage / "tool" / f"{GITHUB_TOOL}.d"
    for agent in ("ghost", "coder"):
        rule = SPEC_RULE.replace("coder_t", f"{agent}_t")
        desk.grant(rule, desk.storage / "agent" / f"{agent}.d" / "policy", controls / "policy")

    refused, result = desk.native("ghost", GITHUB_TOOL, {"query": "x"})
    assert refused.rc != 0 and result["status"] != "ok", refused
    assert "EACCES" in json.dumps(result), result
    assert RUNTIME in json.dumps(result) + refused.err, result
    assert desk.received("github") == []

    ran, result = desk.native("coder", GITHUB_TOOL, {"query": "y"})
    assert ran.rc == 0 and result["status"] == "ok", ran
    assert [m["params"]["arguments"] for m in desk.received("github")
            if m.get("method") == "tools/call"] == [{"query": "y"}]  # fmt: skip


# ======================================================= C-2 edited through the host's view


@needs_root
@needs_fuse
def test_a_program_control_edited_through_the_host_view_takes_the_tool_out_of_the_agents_view(
    desk: Desk,
) -> None:
    """C-2: ``tool/<name>.d/program`` is optional; malformed, non-object or failing schema
    validation makes the tool unavailable, and it grants nothing.  Edited through the host's
    mount (F-1: same as a direct write once fsynced), each bad version takes the tool out of
    the agent's view (F-1: only what the chain lets it execute) and refuses its calls;
    ``ctx bootstrap`` names it and leaves the administrator's file as it is (R-5); deleting
    the control brings the tool back.  C-1: a valid program (a success-result schema) is
    never held against the output while programmatic tool calling is off."""
    name = "demo.prog"
    (desk.top / f"{name}.sh").write_text(PRODUCT_TOOL)
    manifest = {
        "manifest": 2, "kind": "tool", "name": name, "description": "Multiplies.",
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                   "additionalProperties": False},
        "cap": {"side_effects": False, "network": False},
        "exec": f"{name}.sh", "program": RESULT_SCHEMA,
    }  # fmt: skip
    (desk.top / f"{name}.json").write_text(json.dumps(manifest))
    installed = desk.ctx("object", "install", desk.top / f"{name}.json", "--tier", "system")
    assert installed.rc == 0, installed
    desk.agent("coder", [name], [])
    controls = desk.storage / "tool" / f"{name}.d"
    assert json.loads((controls / "program").read_text()) == RESULT_SCHEMA

    # a valid program grants nothing: the tool's own policy is still silent
    ran, result = desk.native("coder", name, {"a": 2})
    assert ran.rc != 0 and "EACCES" in json.dumps(result), ran
    desk.grant(f"allow coder_t tool:{name} execute", controls / "policy")

    host, view = desk.top / "ctx", desk.top / "coder-ctx"
    shown = lambda: name in os.listdir(view / "tool")  # noqa: E731
    with ctx_mount(desk.storage, host), ctx_mount(desk.storage, view, "--as", "coder"):
        assert shown()
        ran, result = desk.native("coder", name, {"a": 2})
        assert ran.rc == 0 and result["status"] == "ok", ran
        assert result["output"] == {"product": 6}  # not {"sum": ...}: never checked (C-1)

        for bad in (b"{not json", b"[]", b'{"type": "nope"}'):
            (host / "tool" / f"{name}.d" / "program").unlink()
            write_durably(host / "tool" / f"{name}.d", "program", bad)
            assert (controls / "program").read_bytes() == bad
            assert wait_for(lambda: not shown(), 5), bad
            hidden = lambda: errno_of(lambda: os.stat(view / "tool" / name)) == "ENOENT"  # noqa: E731
            assert wait_for(hidden, 5), bad
            assert desk.status(name) == "unavailable", bad
        ran, result = desk.native("coder", name, {"a": 2})
        assert ran.rc != 0 and result["status"] != "ok", ran

        booted = desk.ctx("bootstrap")
        assert name in booted.out + booted.err, booted
        assert (controls / "program").read_bytes() == b'{"type": "nope"}'
        assert desk.status(name) == "unavailable"

        (host / "tool" / f"{name}.d" / "program").unlink()  # missing is fine
        assert wait_for(shown, 5)
        assert desk.status(name) == "available"
        ran, result = desk.native("coder", name, {"a": 2})
        assert ran.rc == 0 and result["output"] == {"product": 6}, ran


# ============================================== X-1: ordinary files, Linux permissions, policy


@needs_root
@needs_fuse
def test_agents_of_two_uids_share_a_space_through_their_views_with_ordinary_files_only(
    desk: Desk, unprivileged_user: UnprivilegedUser
) -> None:
    """X-1: a space is governed by uid/gid, directory permissions and ``shared:<name>
    read|write``, and has "no collaboration DSL: advanced agents just create ordinary files".
    Through their own mounted views (F-1), alice (the test user) and bob (another uid in the
    space's group) make directories and files anywhere the modes let them, each file theirs
    and the space's group; bob reads alice's but cannot change or delete it (her modes, the
    space's sticky directory); neither may add to the space's ``tool/`` tier; carol, granted
    ``shared:team read`` only, reads and cannot write.  Nothing but their files appears."""
    group = unprivileged_user.gid
    made = desk.ctx("shared", "create", "team", "--group", str(group))
    assert made.rc == 0, made
    people: dict[str, UnprivilegedUser] = {}
    for name, options, grants in (
        ("alice", ["--user", str(unprivileged_user.uid)], ["read", "write"]),
        ("bob", ["--groups", str(group)], ["read", "write"]),
        ("carol", ["--groups", str(group)], ["read"]),
    ):
        req = {"name": name, "label": f"{name}_t", "shared": {"team": grants}}
        created = desk.ctx("agent", "create", *options, "-", "--json", input=json.dumps(req))
        assert created.rc == 0, created
        identity = created.json()["identity"]
        people[name] = UnprivilegedUser(name, identity["uid"], identity["gid"])
    assert people["bob"].uid != people["alice"].uid

    def as_agent(name: str, script: str) -> subprocess.CompletedProcess:
        space = desk.top / f"{name}-ctx" / "shared" / "team"
        return run_as(people[name], ["/bin/sh", "-c", f"umask 022; cd {space} && {script}"],
                      [group] if name != "alice" else [], cwd=Path("/"))  # fmt: skip

    on_disk = desk.storage / "shared" / "team"
    views = [desk.top / f"{name}-ctx" for name in people]
    with (
        ctx_mount(desk.storage, views[0], "--as", "alice"),
        ctx_mount(desk.storage, views[1], "--as", "bob"),
        ctx_mount(desk.storage, views[2], "--as", "carol"),
    ):
        wrote = as_agent("alice", "mkdir board && printf 'draft\\n' > board/plan.md"
                                  " && printf 'hello\\n' > readme.md")  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        tier = as_agent("alice", ": > tool/helper")
        assert tier.returncode != 0 and "Permission denied" in tier.stderr, tier

        read = as_agent("bob", "cat board/plan.md readme.md")
        assert read.returncode == 0 and read.stdout == "draft\nhello\n", read
        reviewed = as_agent("bob", "printf 'ok\\n' > data/review.md")
        assert reviewed.returncode == 0, reviewed.stderr
        for attempt in ("printf x >> board/plan.md", "rm -f readme.md", "mv readme.md mine.md"):
            refused = as_agent("bob", attempt)
            assert refused.returncode != 0, (attempt, refused)

        seen = as_agent("carol", "cat data/review.md board/plan.md")
        assert seen.returncode == 0 and seen.stdout == "ok\ndraft\n", seen
        for attempt in ("printf x > data/carol.md", "mkdir notes", "printf x >> data/review.md"):
            refused = as_agent("carol", attempt)
            assert refused.returncode != 0, (attempt, refused)

    for rel, owner, text in (("board/plan.md", "alice", "draft\n"), ("readme.md", "alice",
                             "hello\n"), ("data/review.md", "bob", "ok\n")):  # fmt: skip
        info = (on_disk / rel).stat()
        assert (info.st_uid, info.st_gid) == (people[owner].uid, group), rel
        assert (on_disk / rel).read_text() == text, rel
    assert set(os.listdir(on_disk)) == {"tool", "data", "queue", "agent", "board", "readme.md"}
    assert os.listdir(on_disk / "tool") == []
    assert os.listdir(on_disk / "data") == ["review.md"]
    assert os.listdir(on_disk / "board") == ["plan.md"]


# ================================================================ D-1: every spelling of a topic


def test_each_manual_answers_to_its_alias_its_stem_and_its_file_name_with_the_installed_bytes(
    desk: Desk,
) -> None:
    """D-1: "``agent``, ``model``, … are CLI aliases of ``ctx.agent.md``, …" and ``ctx man``
    "reads the installed file": the alias, the page's stem and its file name print the same
    bytes, those of ``shared/cortexfs-docs/man/ctx.TOPIC.md``, which mirror ``docs/spec``;
    ``--json`` names each file; the README answers to its names too.  Other spellings (case,
    a directory, a path out of the bundle) are ENOENT, exit 1."""
    bundle = desk.storage / "shared" / "cortexfs-docs"
    for alias, page in MAN_PAGES.items():
        installed = (bundle / "man" / page).read_text()
        assert installed == (REPO / "docs" / "spec" / page).read_text(), page
        for spelling in (alias, page.removesuffix(".md"), page):
            shown = desk.ctx("man", spelling)
            assert shown.rc == 0 and shown.out == installed, (spelling, shown)
            assert "built-in" not in shown.err, shown
    readme = (bundle / "README.md").read_text()
    for spelling in ("README", "README.md"):
        shown = desk.ctx("man", spelling)
        assert shown.rc == 0 and shown.out == readme, (spelling, shown)
    listed = desk.ctx("man", "--json")
    assert listed.rc == 0, listed
    paths = {t["topic"]: (t["page"], t["path"], t["origin"]) for t in listed.json()}
    assert paths == {
        "README": ("README.md", str(bundle / "README.md"), "installed"),
        **{a: (p, str(bundle / "man" / p), "installed") for a, p in MAN_PAGES.items()},
    }
    for wrong in ("AGENT", "man/ctx.agent.md", "../README.md", "ctx.agent.md.md"):
        refused = desk.ctx("man", wrong)
        assert refused.rc == 1 and refused.err.startswith("ctx: ENOENT: "), (wrong, refused)
        assert refused.out == "", refused


# ===================================================== R-5: repaired under a live mount


@needs_root
@needs_fuse
def test_bootstrap_repairs_what_was_deleted_through_a_live_mount_and_grants_nothing_back(
    desk: Desk,
) -> None:
    """R-5: ``ctx bootstrap`` "creates or repairs … the core tools, ``tool/tsh.d/config``, and
    the docs bundle", "is idempotent and never destroys user data".  A core tool, the tsh
    configuration and a manual page removed through the host's mount come back (and show in
    the live view at once), files the user wrote through the mount stay, the repaired tool's
    own policy grants nothing (the agent's view shows it only once the grant is written
    again), and a second run changes nothing."""
    desk.agent("coder", ["fs.stat"], [])
    controls = desk.storage / "tool" / "fs.stat.d"
    desk.grant("allow coder_t tool:fs.stat execute", controls / "policy")
    host, view = desk.top / "ctx", desk.top / "coder-ctx"
    with ctx_mount(desk.storage, host), ctx_mount(desk.storage, view, "--as", "coder"):
        assert "fs.stat" in os.listdir(view / "tool")
        mine = host / "shared" / "proj" / "data"
        write_durably(mine, "notes.md", b"# kept\n")
        removed = subprocess.run(
            ["rm", "-r", host / "tool" / "fs.stat", host / "tool" / "fs.stat.d",
             host / "tool" / "tsh.d" / "config",
             host / "shared" / "cortexfs-docs" / "man" / "ctx.session.md"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        assert wait_for(lambda: "fs.stat" not in os.listdir(view / "tool"), 5)

        repaired = desk.ctx("bootstrap")
        assert repaired.rc == 0, repaired
        for path in ("tool/fs.stat", "tool/tsh.d/config",
                     "shared/cortexfs-docs/man/ctx.session.md"):  # fmt: skip
            assert path in repaired.out, (path, repaired)
            assert (host / path).is_file(), path
        assert os.access(host / "tool" / "fs.stat", os.X_OK)
        rules = [line for line in (controls / "policy").read_text().splitlines()
                 if line.strip() and not line.startswith("#")]  # fmt: skip
        assert rules == [], rules
        assert (mine / "notes.md").read_bytes() == b"# kept\n"
        session = desk.ctx("man", "session")
        assert session.rc == 0 and "built-in" not in session.err, session
        assert session.out == (REPO / "docs" / "spec" / "ctx.session.md").read_text()
        # Repairing granted nothing; the view may answer from what it decided before the
        # removal for up to a second (docs/mount.md: "a policy change shows within a second").
        time.sleep(1.2)
        assert "fs.stat" not in os.listdir(view / "tool")

        desk.grant("allow coder_t tool:fs.stat execute", controls / "policy")
        assert wait_for(lambda: "fs.stat" in os.listdir(view / "tool"), 5)
        before = snapshot(desk.storage)
        again = desk.ctx("bootstrap")
        assert again.rc == 0, again
        assert "created" not in again.out and "repaired" not in again.out, again
        assert snapshot(desk.storage) == before


# ================================================== F-1: the command line in SPEC's order


@needs_root
@needs_fuse
def test_mount_takes_as_after_the_mount_point_and_refuses_illegal_agent_names(
    desk: Desk,
) -> None:
    """F-1 spells ``ctx mount MOUNTPOINT [--as AGENT]``: in that order it mounts AGENT's
    view (here: ``fs.read`` but no ``shell.exec``), which ``ctx umount`` removes, the mount
    process exiting 0.  R-3: an agent name that is not an object name is "rejected with
    EINVAL" before anything is mounted, exit 2 (a usage error)."""
    desk.agent("coder", ["fs.read"], [])
    desk.grant("allow coder_t tool:fs.read execute",
               desk.storage / "tool" / "fs.read.d" / "policy")  # fmt: skip
    point = desk.top / "ctx"
    point.mkdir()
    for wrong in ("coder.d", ".coder", "c" * 65, "co/der", "", "cöder"):
        refused = ctx_run("mount", point, "--as", wrong, "--storage", desk.storage,
                          timeout=MOUNT_WAIT)  # fmt: skip
        assert refused.rc == 2, (wrong, refused)
        assert "EINVAL" in refused.err, (wrong, refused)
        assert not mounted_at(point)
    assert os.listdir(point) == []

    proc = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "ctx"), "mount", str(point), "--as", "coder"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=desk.env,
    )  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(point) or proc.poll() is not None, MOUNT_WAIT)
        assert mounted_at(point), proc.communicate(timeout=5)
        tools = set(os.listdir(point / "tool"))
        assert "fs.read" in tools and "shell.exec" not in tools, tools
        assert set(os.listdir(point)) <= ROOT_ENTRIES
        assert set(os.listdir(point / "agent")) == {"coder", "coder.d"}
        umounted = ctx_run("umount", point, env=clean_env())
        assert umounted.rc == 0, umounted
        assert proc.wait(timeout=MOUNT_WAIT) == 0
        assert not mounted_at(point)
    finally:
        if mounted_at(point):
            subprocess.run(["umount", "-l", str(point)], check=False)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
