"""``ctx policy explain AGENT CLASS:NAME PERM [--location DIR] [--json]`` (SPEC §5, P-3 … P-8)
asked about every class and permission of P-3 — tool, model, shared, session, mount, agent,
network — with objects that exist and objects that do not, names at the edges of R-3, network
names other than ``default``, agents that do not exist, are damaged, or whose policy the
caller cannot read, and odd places: relative, with ``..``, a trailing ``/``, a symbolic link,
other spellings of the storage root.

Each explanation is held to what happens when the agent tries the thing: ``ctx run`` of a tool
(which file ``CTX_PATH`` finds, T-4), the mounts a tool is given (``CTX_MOUNTS``), the view of
``ctx mount --as AGENT`` (F-1) and a session recorded in a shared space (S-6).  The decision
names the step that denied (P-5), its ``--json`` holds the documented keys and is the same
however the root is spelled, and ``ctx policy query`` on the same policy files (P-8) agrees
with steps 5 and 6."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    ctx_run,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

SCRATCH = scratch_top(__file__)
GROUP = 4300  # the spaces' group; both agents are members
CODER_UID, REV_UID = 4301, 4302
ECHO = "#!/bin/sh\ncat\n"
MOUNTS = '#!/bin/sh\nprintf "%s" "$CTX_MOUNTS"\n'  # the mounts the runner gave the tool
SPACE_TOOL = "#!/bin/sh\necho from-the-space\n"
STEP_NAMES = [
    "peer credentials",
    "mode bits",
    "mount visibility",
    "agent label",
    "object policy",
    "tool/model policy",
]
KEYS = ["agent", "object", "permission", "allowed", "step", "step_name", "errno", "reason"]
STEP_KEYS = ["step", "name", "result", "errno", "detail"]
RESULTS = {"pass", "deny", "n/a", "not reached"}
CODER_SESSIONS = "shared/proj/agent/coder/session"
REV_SESSIONS = "shared/proj/agent/rev/session"


# ====================================================================== the world


@dataclass
class World(OnStorage):
    """A storage root below ``top`` with two agents of the group of the space ``proj``:
    ``coder`` (a workspace mounted read-write at /workspace) and ``rev``; three tools, one
    of them in the space's tier; three models; sessions recorded in the space."""

    top: Path

    @property
    def storage(self) -> Path:  # type: ignore[override]
        return self.top / "storage"

    @property
    def workspace(self) -> Path:
        return self.top / "ws"

    def control(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """``storage/rel`` written as the host writes a control: a root-owned file renamed
        over the old one."""
        path = self.storage / rel
        temp = path.with_name(path.name + ".edit")
        temp.write_bytes(data)
        temp.chmod(mode)
        os.replace(temp, path)

    def add_rules(self, rel: str, *rules: str) -> None:
        path = self.storage / rel
        self.control(rel, path.read_bytes() + "".join(f"{r}\n" for r in rules).encode())

    def drop_rule(self, rel: str, rule: str) -> None:
        text = (self.storage / rel).read_text()
        assert f"{rule}\n" in text, (rel, rule)
        self.control(rel, text.replace(f"{rule}\n", "").encode())

    def explain(self, agent: str, obj: str, perm: str, *extra: str) -> tuple[Run, dict]:
        """``--json`` explanation, checked to be a complete decision (exit 0 or 1)."""
        r = self.ctx("policy", "explain", *extra, "--json", "--", agent, obj, perm)
        assert r.rc in (0, 1) and "Traceback" not in r.err, r
        return r, complete_decision(r, agent, obj, perm)

    def refused(self, agent: str, obj: str, perm: str, *extra: str) -> dict:
        """A malformed request: exit 2, one EINVAL line on stderr, the error on stdout."""
        r = self.ctx("policy", "explain", *extra, "--json", "--", agent, obj, perm)
        assert r.rc == 2 and "Traceback" not in r.err, r
        assert r.err.startswith("ctx: EINVAL: ") and r.err.count("\n") == 1, r
        error = r.json()
        assert error["error"] == "EINVAL" and error["errno"] == 22, r
        return error

    def query(self, *policies: str, rule: tuple[str, str, str]) -> Run:
        args = [a for p in policies for a in ("--policy", self.storage / p)]
        return self.ctx("policy", "query", *args, "--", *rule)

    def native(self, agent: str, tool: str, *options: str, value: object = None) -> dict:
        """The result frame of ``ctx run --native --agent AGENT OPTIONS TOOL``."""
        text = json.dumps({} if value is None else value)
        r = self.ctx("run", "--native", "--agent", agent, *options, tool, input=text)
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return frames[-1]

    def tool_mounts(self, agent: str = "coder") -> list[list]:
        """The mounts the runner gives a tool of ``agent`` (``CTX_MOUNTS``)."""
        result = self.native(agent, "env.mounts")
        assert result["status"] == "ok", result
        output = result["output"]  # JSON the tool printed, given back parsed
        return output if isinstance(output, list) else json.loads(output)

    def mounts_text(self, agent: str = "coder") -> str:
        r = self.ctx("run", "--agent", agent, "env.mounts")
        assert r.rc == 0, r
        return r.out


def complete_decision(r: Run, agent: str, obj: str, perm: str) -> dict:
    """The documented ``--json`` of an explanation (docs/policy.md, P-8): its keys, the six
    steps in order, the first denial deciding and every later step not reached (P-5)."""
    doc = r.json()
    assert list(doc)[: len(KEYS)] == KEYS and set(doc) == {*KEYS, "steps"}, doc
    assert (doc["agent"], doc["object"], doc["permission"]) == (agent, obj, perm), doc
    assert doc["allowed"] is (r.rc == 0), r
    steps = doc["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6], doc
    assert [s["name"] for s in steps] == STEP_NAMES, doc
    for s in steps:
        assert list(s) == STEP_KEYS and s["result"] in RESULTS, s
        assert (s["errno"] is not None) is (s["result"] == "deny"), s
        assert isinstance(s["detail"], str) and s["detail"], s
    denials = [s for s in steps if s["result"] == "deny"]
    if doc["allowed"]:
        assert denials == [] and doc["step"] is None and doc["errno"] is None, doc
        assert not any(s["result"] == "not reached" for s in steps), doc
        return doc
    first = denials[0]
    assert len(denials) == 1, doc
    assert (doc["step"], doc["step_name"]) == (first["step"], first["name"]), doc
    assert doc["errno"] == first["errno"] and doc["errno"] in ("EACCES", "ENOENT"), doc
    assert doc["reason"] == f"step {first['step']} ({first['name']}): {first['detail']}", doc
    assert all(s["result"] == "not reached" for s in steps[first["step"] :]), doc
    return doc


def make_world(top: Path) -> World:
    w = World(top)
    assert ctx_run("bootstrap", "--storage", w.storage).rc == 0
    w.workspace.mkdir(mode=0o777)
    w.workspace.chmod(0o777)
    src = top / "src"
    for name, program in (("demo.echo", ECHO), ("demo.two", ECHO), ("env.mounts", MOUNTS)):
        r = w.ctx("object", "install", tool_manifest(src, name, program), "--tier", "system")
        assert r.rc == 0, r
    for space in ("proj", "other"):
        assert w.ctx("shared", "create", space, "--group", str(GROUP)).rc == 0
    manifest = tool_manifest(src, "sp.only", SPACE_TOOL)
    assert w.ctx("object", "install", manifest, "--tier", "shared:proj").rc == 0
    coder = {
        "name": "coder",
        "label": "coder_t",
        "tools": ["demo.echo", "demo.two", "env.mounts", "sp.only"],
        "model": ["prov/m1", "prov/m2"],
        "shared": {"proj": ["read", "write"]},
        "mount": [[str(w.workspace), "/workspace", "rw"]],
    }
    rev = {
        "name": "rev",
        "label": "rev_t",
        "tools": ["demo.echo", "env.mounts"],
        "shared": {"proj": ["read", "write"]},
    }
    for request, uid in ((coder, CODER_UID), (rev, REV_UID)):
        ids = ("--user", str(uid), "--gid", str(uid), "--groups", str(GROUP))
        w.create_agent(request, *ids)
    for tool, labels in (("demo.echo", ["coder_t", "rev_t"]), ("env.mounts", ["coder_t", "rev_t"])):
        w.add_rules(f"tool/{tool}.d/policy", *(f"allow {lb} tool:{tool} execute" for lb in labels))
    w.add_rules("shared/proj/tool/sp.only.d/policy", "allow coder_t tool:sp.only execute")
    (w.storage / "model" / "prov").mkdir(mode=0o755)
    for model in ("m1", "m2", "m3"):
        (w.storage / "model" / "prov" / model).write_text("a model entry\n")
        (w.storage / "model" / "prov" / f"{model}.d").mkdir(mode=0o755)
        w.control(f"model/prov/{model}.d/policy", b"")
    for model in ("m1", "m3"):
        w.add_rules(f"model/prov/{model}.d/policy", f"allow coder_t model:prov/{model} use")
    w.add_rules(
        "agent/coder.d/policy",
        "allow coder_t session:s1 read",
        "allow coder_t session:s1 write",
        "allow coder_t agent:rev read",
        "allow coder_t agent:kid create",
    )
    w.add_rules("agent/rev.d/policy", "allow rev_t network:default connect")
    for agent, session in (("rev", "s1"), ("rev", "s2"), ("coder", "s1")):
        result = w.native(agent, "demo.echo", "--project", "proj", "--session", session)
        assert result["status"] == "ok", result
    return w


@pytest.fixture(scope="module")
def base() -> Iterator[World]:
    """The world, shared by the tests that only ask about it."""
    world = make_world(new_scratch_dir(SCRATCH, "base"))
    try:
        yield world
    finally:
        shutil.rmtree(world.top, ignore_errors=True)


@pytest.fixture
def fresh(base: World) -> Iterator[World]:
    """A copy of the world of its own (owners and modes kept), for a test that changes it;
    the mount controls name the copy's workspace and root."""
    top = new_scratch_dir(SCRATCH, "fresh")
    top.rmdir()
    subprocess.run(["cp", "-a", str(base.top), str(top)], check=True)
    w = World(top)
    for mount in (w.storage / "agent").glob("*.d/mount"):
        text = mount.read_text().replace(str(base.top), str(top))
        w.control(str(mount.relative_to(w.storage)), text.encode())
    try:
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ====================================================================== every class of P-3

S1 = ("--location", CODER_SESSIONS)
# (agent, object, permission, extra options) -> the step that denies (None: allowed) and errno
MATRIX = [
    ("coder", "tool:demo.echo", "execute", (), None, None),
    ("coder", "tool:demo.two", "execute", (), 6, "EACCES"),
    ("coder", "tool:no.such", "execute", (), 2, "ENOENT"),
    ("coder", "tool:sp.only", "execute", (), None, None),
    ("coder", "model:prov/m1", "use", (), None, None),
    ("coder", "model:prov/m2", "use", (), 6, "EACCES"),
    ("coder", "model:prov/m3", "use", (), 5, "EACCES"),
    ("coder", "model:prov/none", "use", (), 2, "ENOENT"),
    ("coder", "model:none/m1", "use", (), 2, "ENOENT"),
    ("coder", "shared:proj", "read", (), None, None),
    ("coder", "shared:proj", "write", (), None, None),
    ("coder", "shared:other", "read", (), 5, "EACCES"),
    ("coder", "shared:none", "read", (), 2, "ENOENT"),
    ("coder", "session:s1", "read", S1, None, None),
    ("coder", "session:s1", "write", S1, None, None),
    ("coder", "session:s1", "resume", S1, 5, "EACCES"),
    ("coder", "session:none", "read", S1, 2, "ENOENT"),
    ("coder", "mount:workspace", "read", (), None, None),
    ("coder", "mount:workspace", "write", (), None, None),
    ("coder", "mount:ctx", "read", (), None, None),
    ("coder", "mount:none", "read", (), 2, "ENOENT"),
    ("coder", "agent:rev", "read", (), None, None),
    ("coder", "agent:rev", "write", (), 2, "EACCES"),
    ("coder", "agent:rev", "start", (), 5, "EACCES"),
    ("coder", "agent:rev", "stop", (), 5, "EACCES"),
    ("coder", "agent:kid", "create", (), None, None),
    ("coder", "agent:ghost", "start", (), 2, "ENOENT"),
    ("coder", "network:default", "connect", (), 5, "EACCES"),
    ("rev", "network:default", "connect", (), None, None),
    ("ghost", "network:default", "connect", (), 1, "ENOENT"),
]


OWN_POLICY = {
    "tool:demo.echo": "tool/demo.echo.d/policy",
    "tool:demo.two": "tool/demo.two.d/policy",
    "tool:sp.only": "shared/proj/tool/sp.only.d/policy",
    "model:prov/m1": "model/prov/m1.d/policy",
    "model:prov/m2": "model/prov/m2.d/policy",
    "model:prov/m3": "model/prov/m3.d/policy",
}


def test_every_class_and_permission_of_p3_is_decided_at_the_step_that_denies(base: World) -> None:
    """P-3 … P-6, P-8: each class and permission, on objects that exist and that do not, is a
    complete decision naming the one step that denied (ENOENT for what is missing); the text
    form ends with the same verdict line.  Where the chain reached step 5, ``ctx policy
    query`` on the agent's policy answers as step 5 did; where it reached step 6 (tools and
    models), query on both layers answers as the whole chain did, and on the object's own
    policy alone as step 6 did."""
    seen = set()
    queried = 0
    for agent, obj, perm, extra, step, code in MATRIX:
        r, doc = base.explain(agent, obj, perm, *extra)
        assert (doc["step"], doc["errno"]) == (step, code), (obj, perm, r)
        step5, step6 = doc["steps"][4]["result"], doc["steps"][5]["result"]
        rule = (f"{agent}_t", obj, perm)
        if step5 in ("pass", "deny"):
            alone = base.query(f"agent/{agent}.d/policy", rule=rule)
            assert (alone.rc, alone.out) == ((0, "allow\n") if step5 == "pass" else (1, "deny\n"))
            queried += 1
        if step6 in ("pass", "deny"):
            both = base.query(f"agent/{agent}.d/policy", OWN_POLICY[obj], rule=rule)
            assert (both.rc == 0) is doc["allowed"], (doc, both)
            layer = base.query(OWN_POLICY[obj], rule=rule)
            assert layer.rc == (0 if step6 == "pass" else 1), (doc, layer)
        cls = obj.split(":")[0]
        if cls in seen:
            continue
        seen.add(cls)
        text = base.ctx("policy", "explain", agent, obj, perm, *extra)
        assert text.rc == r.rc, text
        verdict = "allow" if doc["allowed"] else f"deny: {doc['errno']}: {doc['reason']}"
        assert text.lines()[0] == f"agent {agent}: {obj} {perm}", text
        assert text.lines()[-1] == verdict and len(text.lines()) == 8, text
    assert seen == {"tool", "model", "shared", "session", "mount", "agent", "network"}
    assert queried >= 15


# ====================================================================== names, R-3 and P-4


def test_names_at_the_edges_of_r3_are_decisions_and_beyond_them_einval_in_explain_and_query(
    base: World,
) -> None:
    """R-3, P-4, P-8: a legal name at the edge (64 bytes, dots inside, mixed case, ``.d``
    inside) is asked
    about and found missing (ENOENT at step 2); an illegal one — 65 bytes, a leading dot or
    dash, ``.d`` at the end, ``..``, a slash, a blank, non-ASCII, empty — is a
    malformed request in every class, exit 2 with EINVAL, for explain as for query."""
    legal = ["a" * 64, "x..y", "X.d-b_9"]
    illegal = ["a" * 65, ".x", "-x", "x.d", "..", "a/b", "a b", "caf\u00e9", ""]
    for name in legal:
        for obj, perm, extra in (
            (f"tool:{name}", "execute", ()),
            (f"shared:{name}", "read", ()),
            (f"session:{name}", "read", S1),
            (f"agent:{name}", "read", ()),
            (f"model:{name}/{name}", "use", ()),
        ):
            r, doc = base.explain("coder", obj, perm, *extra)
            assert (doc["step"], doc["errno"]) == (2, "ENOENT"), r
        r, doc = base.explain("coder", f"mount:{name}", "read")
        assert (doc["step"], doc["errno"]) == (2, "ENOENT"), r
        r, doc = base.explain(name, "tool:demo.echo", "execute")
        assert (doc["step"], doc["errno"]) == (1, "ENOENT"), r
    for name in illegal:
        for obj, perm in (
            (f"tool:{name}", "execute"),
            (f"agent:{name}", "create"),
            (f"model:prov/{name}", "use"),
            (f"mount:{name}", "write"),
        ):
            base.refused("coder", obj, perm)
        q = base.query("agent/coder.d/policy", rule=("coder_t", f"shared:{name}", "read"))
        assert q.rc == 2 and "EINVAL" in q.err and "Traceback" not in q.err, q
        base.refused(name, "tool:demo.echo", "execute")
        base.refused("coder", f"session:{name}", "read", *S1)


def test_network_names_other_than_default_are_refused_everywhere(base: World) -> None:
    """P-4: the only network object is ``default``: ``Default``, ``DEFAULT``, ``default.d``,
    ``localhost``, ``internet``, ``default1`` are EINVAL naming P-4 in explain (exit 2, for
    an agent that exists or not), in query (exit 2) and, as a rule, in check (exit 1)."""
    for name in ("Default", "DEFAULT", "default.d", "localhost", "internet", "default1"):
        for agent in ("rev", "ghost"):
            error = base.refused(agent, f"network:{name}", "connect")
            assert "(P-4)" in error["message"] and "'default'" in error["message"], error
        q = base.query("agent/rev.d/policy", rule=("rev_t", f"network:{name}", "connect"))
        assert q.rc == 2 and "(P-4)" in q.err, q
        policy = base.top / f"net-{name}.policy"
        policy.write_text(f"allow rev_t network:{name} connect\n")
        checked = base.ctx("policy", "check", policy)
        assert checked.rc == 1 and checked.err.startswith(f"{policy}:1: EINVAL: "), checked
    base.refused("rev", "network:default", "read")
    base.refused("rev", "network:default", "connect", "--location", "tool")


# ====================================================================== odd places


def test_odd_locations_are_einval_or_judged_without_following_a_link(fresh: World) -> None:
    """P-5 step 2, P-8: ``--location`` takes the documented forms only, relative to the
    root or absolute within it: a trailing slash, ``./``, ``..``, an absolute path outside the
    root, blanks, a non-numeric home, the manual bundle are malformed (exit 2, the location
    quoted), and an absolute path within the root is judged as its relative form; a space
    reached through a symbolic link is refused at step 2 naming the link, for a tool and for
    a session, never followed to the space it leads to; a location given for a class that
    has one place is EINVAL too."""
    w = fresh
    (w.storage / "shared" / "alias").symlink_to("proj")
    root = str(w.storage)
    for location in (
        "tool/",
        "./tool",
        "tool/../tool",
        f"{w.storage.parent}/tool",
        "shared/proj/tool/",
        "shared/../tool",
        "home/x/tool",
        "",
        " tool",
        "tool ",
        "shared/cortexfs-docs/tool",
        "shared/a b/tool",
        "shared/.x/tool",
    ):
        error = w.refused("coder", "tool:demo.echo", "execute", "--location", location)
        assert repr(location) in error["message"], error
    absolute = w.explain("coder", "tool:demo.echo", "execute", "--location", f"{root}/tool")
    relative = w.explain("coder", "tool:demo.echo", "execute", "--location", "tool")
    assert (absolute[0].rc, absolute[1]) == (relative[0].rc, relative[1])
    for location in (
        f"{CODER_SESSIONS}/",
        "shared/proj/agent/coder/session/.",
        "shared/proj/agent/../session",
        f"/{CODER_SESSIONS}",
        "shared/proj/agent/coder.d/session",
        "home/x/agent/coder/session",
    ):
        w.refused("coder", "session:s1", "read", "--location", location)
    for obj, perm in (
        ("model:prov/m1", "use"),
        ("shared:proj", "read"),
        ("agent:rev", "read"),
        ("mount:ctx", "read"),
    ):
        w.refused("coder", obj, perm, "--location", "tool")

    r, doc = w.explain("coder", "tool:sp.only", "execute", "--location", "shared/alias/tool")
    assert (doc["step"], doc["errno"]) == (2, "EACCES"), r
    assert "shared/alias is a symbolic link" in doc["reason"], r
    r, doc = w.explain(
        "coder", "session:s1", "read", "--location", "shared/alias/agent/coder/session"
    )
    assert (doc["step"], doc["errno"]) == (2, "EACCES"), r
    assert "shared/alias is a symbolic link" in doc["reason"], r
    # The same objects by their own places are allowed: only the link was refused.
    assert (
        w.explain("coder", "tool:sp.only", "execute", "--location", "shared/proj/tool")[0].rc == 0
    )
    assert w.explain("coder", "session:s1", "read", *S1)[0].rc == 0
    # A home spelled with leading zeros is another directory, not the agent's home.
    r, doc = w.explain(
        "coder", "tool:demo.echo", "execute", "--location", f"home/0{CODER_UID}/tool"
    )
    assert (doc["step"], doc["errno"]) == (2, "ENOENT"), r


def test_every_spelling_of_the_storage_root_gives_the_same_json(base: World) -> None:
    """P-8: explain reads one root however it is named — absolute, relative to the working
    directory, with a trailing slash, through ``..``, through a symbolic link, by
    ``CTX_STORAGE`` — and its ``--json`` is byte for byte the same, every time it is asked."""
    link = base.top / "root-link"
    if not link.exists():
        link.symlink_to("storage")
    spellings = [
        "storage",
        "storage/",
        "./src/../storage",
        str(base.storage),
        str(link),
        f"{link}/",
    ]
    for obj, perm, extra in (
        ("tool:demo.echo", "execute", ()),
        ("session:s1", "resume", S1),
        ("mount:workspace", "write", ()),
        ("tool:sp.only", "execute", ()),
    ):
        args = ("policy", "explain", "coder", obj, perm, *extra, "--json")
        first = base.ctx(*args)
        assert first.rc in (0, 1), first
        for spelling in spellings:
            again = ctx_run(*args, "--storage", spelling, cwd=base.top)
            assert (again.rc, again.out) == (first.rc, first.out), (spelling, again)
        assert base.ctx(*args).out == first.out


# ====================================================================== where the tool is


def test_a_tool_is_explained_where_ctx_path_finds_it_and_run_runs_that_file(fresh: World) -> None:
    """T-4, P-6: without ``--location`` explain judges the file ``ctx run`` would call: a tool
    only the space's tier holds is judged there and runs; asked in the system tier it is
    missing there.  A tool in both tiers is the system tier's for both, and the space's
    copy, whose own policy does not allow it, changes nothing until it is asked for."""
    w = fresh
    r, doc = w.explain("coder", "tool:sp.only", "execute")
    assert doc["allowed"] and "shared/proj/tool/sp.only.d/policy" in doc["steps"][5]["detail"]
    ran = w.ctx("run", "--agent", "coder", "sp.only")
    assert (ran.rc, ran.out) == (0, "from-the-space\n"), ran
    r, doc = w.explain("coder", "tool:sp.only", "execute", "--location", "tool")
    assert (doc["step"], doc["errno"]) == (2, "ENOENT"), r

    manifest = tool_manifest(w.top / "src2", "demo.echo", SPACE_TOOL)
    assert w.ctx("object", "install", manifest, "--tier", "shared:proj").rc == 0
    r, doc = w.explain("coder", "tool:demo.echo", "execute")
    assert doc["allowed"] and doc["steps"][5]["detail"].split(":")[0] == "tool/demo.echo.d/policy"
    ran = w.ctx("run", "--agent", "coder", "demo.echo", input="system tier\n")
    assert (ran.rc, ran.out) == (0, "system tier\n"), ran
    r, doc = w.explain("coder", "tool:demo.echo", "execute", "--location", "shared/proj/tool")
    assert (doc["step"], doc["errno"]) == (6, "EACCES"), r


def test_a_space_reached_through_a_link_does_not_shadow_the_tool_of_the_real_space(
    fresh: World,
) -> None:
    """T-4, T-5, P-5: the administrator keeps ``shared/alias -> proj`` (a space renamed) and
    the agent's policy names both.  The chain refuses ``shared:alias`` (a link is never
    followed) and the agent's view shows no ``alias``; so the tool of ``proj`` the agent may
    run is what ``ctx run`` runs, and what explain judges."""
    w = fresh
    (w.storage / "shared" / "alias").symlink_to("proj")
    w.add_rules("agent/coder.d/policy", "allow coder_t shared:alias read")
    r, doc = w.explain("coder", "shared:alias", "read")
    assert doc["step"] == 2, r
    assert '"/ctx/shared", "ro", ["cortexfs-docs", "proj"]' in w.mounts_text()
    ran = w.ctx("run", "--agent", "coder", "sp.only")
    assert (ran.rc, ran.out) == (0, "from-the-space\n"), ran
    r, doc = w.explain("coder", "tool:sp.only", "execute")
    assert doc["allowed"], r


def test_explain_judges_the_chain_and_run_refuses_an_unavailable_tool_outside_it(
    fresh: World,
) -> None:
    """P-5, T-1, F-1: explain walks the six steps of the chain; a tool whose ``status`` reads
    ``disabled`` passes them all, yet ``ctx run`` refuses it (EACCES at stage ``resolve``, no
    step of the chain named, since none denied) and the tools the runner shows the agent no
    longer hold it.  Its status back to ``available``, all three agree again."""
    w = fresh
    w.control("tool/demo.echo.d/status", b"disabled\n")
    r, doc = w.explain("coder", "tool:demo.echo", "execute")
    assert doc["allowed"], r
    result = w.native("coder", "demo.echo")
    error = result["error"]
    assert (error["error"], error["stage"], error["step"]) == ("EACCES", "resolve", None), result
    assert "demo.echo.d/status" in error["message"], result
    assert '"demo.echo"' not in w.mounts_text()
    w.control("tool/demo.echo.d/status", b"available\n")
    assert w.native("coder", "demo.echo")["status"] == "ok"
    assert '"demo.echo", "demo.echo.d"' in w.mounts_text()


# ====================================================================== mounts


def mount_of(mounts: list[list], target: str) -> list | None:
    return next((m for m in mounts if m[1] == target), None)


def test_mount_explanations_agree_with_the_mounts_a_tool_is_given(fresh: World) -> None:
    """P-3 mount read/write, P-5 steps 3 and 5: the workspace is given read-write while
    explain allows ``mount:workspace write``; without the policy's ``write`` rule it is given
    read-only and explain names step 5; without ``read`` it is not given and explain denies
    read at step 5; a mount whose source now runs through a symbolic link is not given, and
    explain does not allow it."""
    w = fresh
    assert mount_of(w.tool_mounts(), "/workspace")[2] == "rw"
    assert w.explain("coder", "mount:workspace", "write")[1]["allowed"]
    w.drop_rule("agent/coder.d/policy", "allow coder_t mount:workspace write")
    assert mount_of(w.tool_mounts(), "/workspace")[2] == "ro"
    assert w.explain("coder", "mount:workspace", "write")[1]["step"] == 5
    assert w.explain("coder", "mount:workspace", "read")[1]["allowed"]
    w.drop_rule("agent/coder.d/policy", "allow coder_t mount:workspace read")
    assert mount_of(w.tool_mounts(), "/workspace") is None
    assert w.explain("coder", "mount:workspace", "read")[1]["step"] == 5
    w.add_rules("agent/coder.d/policy", "allow coder_t mount:workspace read")
    assert mount_of(w.tool_mounts(), "/workspace") is not None
    moved = w.top / "ws.real"
    w.workspace.rename(moved)
    w.workspace.symlink_to(moved.name)
    assert mount_of(w.tool_mounts(), "/workspace") is None
    assert not w.explain("coder", "mount:workspace", "read")[1]["allowed"]


def withhold_by_link(w: World) -> tuple[World, str]:
    moved = w.top / "ws.real"
    w.workspace.rename(moved)
    w.workspace.symlink_to(moved.name)
    return w, "workspace"


def withhold_by_copy(w: World) -> tuple[World, str]:
    """The root copied elsewhere (a new disk): its agents' /ctx mount names the old root."""
    copy = World(w.top / "copy")
    copy.top.mkdir(mode=0o755)
    subprocess.run(["cp", "-a", str(w.storage), str(copy.storage)], check=True)
    return copy, "ctx"


@pytest.mark.parametrize("withhold", [withhold_by_link, withhold_by_copy], ids=["link", "copy"])
def test_a_withheld_mount_is_explained_by_why_it_is_withheld(fresh: World, withhold) -> None:
    """P-5, docs/policy.md "Mounts": a mount the agent's table holds but the host withholds
    is denied, and the decision says why, as ``ctx agent show`` and the explanation of a tool
    under it do; it never claims the agent has no such mount."""
    w, name = withhold(fresh)
    shown = w.ctx("agent", "show", "coder")
    withheld = [line for line in shown.lines() if line.startswith("withheld mount:")]
    assert len(withheld) == 1, shown
    r, doc = w.explain("coder", f"mount:{name}", "read")
    assert not doc["allowed"], r
    assert "has no mount named" not in doc["reason"], r
    why = withheld[0].split(": ", 2)[2]
    assert why.split(":")[0] in doc["reason"], (why, r)


# ====================================================================== damaged agents


def test_damaged_agents_are_denied_at_the_step_of_the_damaged_control_in_every_class(
    fresh: World,
) -> None:
    """P-5, docs/policy.md "What the chain reads": for classes with no file on disk (network)
    or one found through the agent's own table (mount) as for a tool: a damaged identity
    denies at step 1, a label that is no subject type at step 4, a missing policy at step 5,
    each naming the file, with EACCES; control directories that are a link to another agent's
    deny at step 1 rather than lend its grants; ``ctx run`` names the same step."""
    w = fresh
    cases = {
        "identity": (b'{"uid": 4301, "gid": \x00}', 1, "agent/{a}.d/identity"),
        "label": (b"coder.d\n", 4, "agent/{a}.d/label"),
        "policy": (None, 5, "agent/{a}.d/policy"),
    }
    agents = w.storage / "agent"
    for control, (data, step, named) in cases.items():
        agent = f"hurt-{control}"
        shutil.copy2(agents / "coder", agents / agent)
        subprocess.run(
            ["cp", "-a", str(agents / "coder.d"), str(agents / f"{agent}.d")], check=True
        )
        if data is None:
            (agents / f"{agent}.d" / control).unlink()
        else:
            w.control(f"agent/{agent}.d/{control}", data)
        for obj, perm in (
            ("network:default", "connect"),
            ("mount:workspace", "read"),
            ("tool:demo.echo", "execute"),
        ):
            r, doc = w.explain(agent, obj, perm)
            assert (doc["step"], doc["errno"]) == (step, "EACCES"), (control, r)
            assert named.format(a=agent) in doc["reason"], (control, r)
        error = w.native(agent, "demo.echo")["error"]
        assert error["error"] == "EACCES" and named.format(a=agent) in error["message"], error
        # An identity that cannot be read stops the runner before the chain (stage agent).
        assert error["step"] == (None if control == "identity" else step), error
    shutil.copy2(agents / "coder", agents / "borrower")
    (agents / "borrower.d").symlink_to("coder.d")
    for obj, perm in (("network:default", "connect"), ("tool:demo.echo", "execute")):
        r, doc = w.explain("borrower", obj, perm)
        assert (doc["step"], doc["errno"]) == (1, "EACCES"), r
    result = w.native("borrower", "demo.echo")
    assert result["status"] == "error" and not (w.workspace / "borrowed").exists(), result


def test_an_agent_entry_that_is_a_link_is_refused_naming_the_link(fresh: World) -> None:
    """P-5, docs/policy.md: every file of the chain is reached without following links; an
    ``agent/<name>`` that is a link to another agent's entry lends nothing, and the refusal
    says what is there — a link — rather than that the path does not exist."""
    w = fresh
    agents = w.storage / "agent"
    (agents / "alias").symlink_to("coder")
    (agents / "alias.d").symlink_to("coder.d")
    r, doc = w.explain("alias", "tool:demo.echo", "execute")
    assert doc["step"] == 1 and not doc["allowed"], r
    assert "does not exist" not in doc["reason"] and "link" in doc["reason"], r


def test_a_policy_the_caller_cannot_read_never_explains_as_allowed(
    fresh: World, unprivileged_user
) -> None:
    """P-5 (fail closed): root reads a policy of mode 0000 as the runner does, so explain and
    ``ctx run`` allow the call alike; a user who may not read the agent's policy gets no
    verdict (docs/policy.md: the refusal is that user's own), an EACCES naming that file,
    never ``allow``."""
    w = fresh
    (w.storage / "agent" / "coder.d" / "policy").chmod(0o000)
    r, doc = w.explain("coder", "tool:demo.echo", "execute")
    assert doc["allowed"], r
    assert w.native("coder", "demo.echo")["status"] == "ok"
    (w.storage / "agent" / "coder.d" / "policy").chmod(0o600)
    argv = [*CTX_ARGV, "policy", "explain", "coder", "tool:demo.echo", "execute", "--json"]
    done = run_as(unprivileged_user, argv, env=w.env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    doc = json.loads(done.stdout)
    assert "allowed" not in doc and doc["error"] == "EACCES", doc
    assert "agent/coder.d/policy" in doc["message"], doc


# ====================================================================== sessions and the view


def test_a_shared_session_explained_as_writable_is_recorded_and_a_read_only_one_is_not(
    fresh: World,
) -> None:
    """S-6, X-1, P-5: an agent that may only read the space is refused recording there at the
    step explain names for ``shared:proj write``, and nothing is made below the space's
    ``agent/``; once the space is writable to it, the recording lands in the session whose
    ``session:<n> write`` explain then allows (the agent's own rule) or denies (no rule)."""
    w = fresh
    w.drop_rule("agent/rev.d/policy", "allow rev_t shared:proj write")
    r, doc = w.explain("rev", "shared:proj", "write")
    assert not doc["allowed"], r
    result = w.native("rev", "demo.echo", "--project", "proj", "--session", "s9")
    assert result["status"] == "error" and result["error"]["step"] == doc["step"], result
    assert not (w.storage / REV_SESSIONS / "s9").exists()
    w.add_rules("agent/rev.d/policy", "allow rev_t shared:proj write")
    assert w.explain("rev", "shared:proj", "write")[1]["allowed"]
    result = w.native("rev", "demo.echo", "--project", "proj", "--session", "s9")
    assert result["status"] == "ok", result
    events = (w.storage / REV_SESSIONS / "s9" / "events.jsonl").read_text().splitlines()
    assert [json.loads(e)["type"] for e in events] == ["tool_call", "tool_result"]
    r, doc = w.explain("rev", "session:s9", "write", "--location", REV_SESSIONS)
    assert (doc["step"], doc["errno"]) == (5, "EACCES"), r


@needs_fuse_as_root
def test_the_mounted_view_shows_exactly_what_explain_allows(fresh: World) -> None:
    """F-1, T-5, S-6: ``ctx mount --as coder`` lists each tool, model, space and session of
    another agent exactly when explain allows executing, using, reading it; a space alias
    that is a link, which explain refuses at step 2, is not listed though the policy names
    it."""
    w = fresh
    (w.storage / "shared" / "alias").symlink_to("proj")
    w.add_rules(
        "agent/coder.d/policy",
        "allow coder_t shared:alias read",
        "allow coder_t shared:other read",
        "allow coder_t model:prov/m3 use",
    )
    (w.storage / "shared" / "other").chmod(0o3750)  # coder's group may no longer write
    where = new_scratch_dir(SCRATCH, "view")
    try:
        (where / "mnt").mkdir()
        with serving(w.storage, where / "mnt", "--as", "coder") as mount:
            root = mount.where
            checks = {
                "tool": ["demo.echo", "demo.two", "env.mounts", "fs.read", "no.such"],
                "model": ["prov/m1", "prov/m2", "prov/m3"],
                "shared": ["proj", "other", "alias", "none"],
            }
            perms = {"tool": "execute", "model": "use", "shared": "read"}
            for cls, names in checks.items():
                for name in names:
                    allowed = w.explain("coder", f"{cls}:{name}", perms[cls])[1]["allowed"]
                    assert (root / cls / name).exists() is allowed, (cls, name)
            listed = set(os.listdir(root / REV_SESSIONS))
            for session in ("s1", "s2"):
                allowed = w.explain(
                    "coder", f"session:{session}", "read", "--location", REV_SESSIONS
                )[1]["allowed"]
                assert (session in listed) is allowed, (session, listed)
            assert listed == {"s1"}
            w.add_rules("agent/coder.d/policy", "allow coder_t session:s2 read")
            assert w.explain("coder", "session:s2", "read", "--location", REV_SESSIONS)[0].rc == 0
            assert wait_for(lambda: "s2" in os.listdir(root / REV_SESSIONS), 10)
    finally:
        shutil.rmtree(where, ignore_errors=True)
