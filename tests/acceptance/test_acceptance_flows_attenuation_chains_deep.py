"""Agents that create agents, several levels deep (SPEC A-3, A-4, §5 P-2 … P-7, S-2, S-3;
docs ctx.agent "Making a child: agent.create", docs/tools.md on ``agent.create``,
docs/sessions.md "An agent's log").

On a root host, agent ``a`` (uid ``nobody``, group 100) is made by the administrator with
four tools, two models, read and write on the space ``team``, its workspace read-write and a
reference directory read-only.  Through the ``agent.create`` tool ``a`` makes ``b`` with a
part of that, and ``b`` makes ``c`` with a part of its part; each level then makes further
levels.  At every level a child must hold no more than its creator holds — tools, models,
space permissions, mounts and their modes, its identity — whatever its ancestors hold; a
request for more is refused with ``EACCES`` naming what is missing and leaves nothing under
``agent/`` or in the homes; each creation is recorded in the child's log and its creator's
log, nowhere else; names and labels collide across levels and across chains (a descendant
asking for an ancestor's name, its own, or an ancestor's label; a loop recreating a removed
ancestor); and an ancestor narrowed, removed or damaged afterwards stops only itself, its
descendants keeping the controls they were given."""

from __future__ import annotations

import fcntl
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
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import Raw
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")

SCRATCH = scratch_top(__file__)
NOBODY = 65534
GROUP = 100  # the chain's one supplementary group, the group of the space ``team``
IDENTITY = {"uid": NOBODY, "gid": NOBODY, "groups": [GROUP]}
M1, M2 = "openai/m1", "openai/m2"
# The three levels every test starts with: what each asked for, and what the host then added.
A_REQUEST_TOOLS = ["fs.read", "fs.list", "fs.stat", "agent.create"]
B_REQUEST = {
    "name": "b",
    "label": "b_t",
    "tools": ["fs.read", "fs.list", "agent.create"],
    "model": [M1],
    "shared": {"team": ["read"]},
    "mount": [["/workspace/sub", "/w", "rw"], ["/ref", "/r", "ro"]],
}
C_REQUEST = {
    "name": "c",
    "label": "c_t",
    "tools": ["fs.read", "agent.create"],
    "model": [M1],
    "shared": {"team": "read"},
    "mount": [["/w/deep", "/x", "ro"]],
}
CREATED_KEYS = {"ts", "type", "agent", "session", "object", "status", "by", "label", "uid", "gid"}


@dataclass
class Chain(OnStorage):
    storage: Path
    ws: Path  # a's workspace, /workspace (rw): the chain's uid owns it
    ref: Path  # a's reference directory, /ref (ro): root's

    def controls(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d"

    def label(self, agent: str) -> str:
        return (self.controls(agent) / "label").read_text().strip()

    def grant(self, agent: str, *rules: str) -> None:
        """The host's hand: ``allow <label> RULE`` appended to the agent's own policy."""
        label = self.label(agent)
        with (self.controls(agent) / "policy").open("a") as policy:
            for rule in rules:
                policy.write(f"allow {label} {rule}\n")

    def revoke(self, policy: Path, *rules: str) -> None:
        gone = set(rules)
        kept = [line for line in policy.read_text().splitlines(True) if line.strip() not in gone]
        assert len(kept) == len(policy.read_text().splitlines()) - len(gone), (policy, rules)
        policy.write_text("".join(kept))

    def allow_model(self, label: str, model: str) -> None:
        with (self.storage / "model" / f"{model}.d" / "policy").open("a") as policy:
            policy.write(f"allow {label} model:{model} use\n")

    def may_create(self, agent: str, child: str, *tools: str) -> None:
        """What the host adds so that ``agent`` may make ``child``: the grant for the name, and
        the tool layer of ``tools`` (agent.create among them) for its label."""
        self.grant(agent, f"agent:{child} create")
        self.allow_tool(self.label(agent), *tools)

    def start(self, agent: str, tool: str, value, session: str) -> subprocess.Popen:
        argv = [*CTX_ARGV, "run", "--agent", agent, "--native", "--session", session, tool]
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        proc.stdin.write(json.dumps(value).encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    @staticmethod
    def finish(proc: subprocess.Popen) -> tuple[int, dict]:
        out, err = proc.communicate(timeout=60)
        lines = out.decode().splitlines()
        frame = json.loads(lines[-1]) if lines else {"stderr": err.decode()}
        return proc.returncode, frame

    def run(self, agent: str, tool: str, value, session: str = "s") -> tuple[int, dict]:
        """``ctx run --agent AGENT --native --session SESSION TOOL``: exit status and the
        ``result`` frame."""
        return self.finish(self.start(agent, tool, value, session))

    def create(self, by: str, request: dict, session: str = "grow") -> tuple[int, dict]:
        return self.run(by, "agent.create", request, session)

    def made(self, by: str, request: dict, session: str = "grow") -> dict:
        rc, frame = self.create(by, request, session)
        assert rc == 0 and frame["status"] == "ok", frame
        return frame["output"]

    def agents(self) -> list[str]:
        """Every entry of ``agent/``, hidden ones too (a staged half of a pair would be)."""
        return sorted(os.listdir(self.storage / "agent"))

    def homes(self) -> list[str]:
        return sorted(os.listdir(self.storage / "home" / str(NOBODY) / "agent"))

    def state(self) -> dict:
        """Everything under ``agent/``, hidden entries too: every control and log, byte for
        byte."""
        return snapshot(self.storage / "agent")

    def log(self, agent: str) -> list[dict]:
        return read_jsonl(self.controls(agent) / "log")

    def children(self, agent: str) -> list[str]:
        return [e["child"] for e in self.log(agent) if "child" in e]

    def rules(self, agent: str) -> list[str]:
        text = (self.controls(agent) / "policy").read_text()
        return sorted(line for line in text.splitlines() if line.startswith("allow"))

    def mounts(self, agent: str) -> list[list[str]]:
        return json.loads((self.controls(agent) / "mount").read_text())

    def identity(self, agent: str) -> dict:
        return json.loads((self.controls(agent) / "identity").read_text())

    def events(self, agent: str, session: str) -> list[dict]:
        place = self.storage / "home" / str(NOBODY) / "agent" / agent / "session" / session
        return read_jsonl(place / "events.jsonl")


def message(frame: dict) -> str:
    return (frame.get("error") or {}).get("message", "")


def assert_refused(outcome: tuple[int, dict], expected: str, *words: str) -> None:
    """Refused with ``expected``: ``EINVAL`` as bad input (the runner's schema stage, exit 2,
    never started; or the tool's own exit 2), anything else as a refusal (exit 1, the tool's
    own exit 1)."""
    rc, frame = outcome
    assert frame.get("status") == "error", frame
    assert frame["error"]["error"] == expected, (expected, frame)
    if expected == "EINVAL":
        assert (rc, frame["exit_status"]) in {(2, None), (1, 2)}, frame
    else:
        assert (rc, frame["exit_status"]) == (1, 1), frame
    for word in words:
        assert word in message(frame), (word, frame)


def rules_of(label: str, *grants: str) -> list[str]:
    return sorted(f"allow {label} {grant}" for grant in grants)


def build(live: Path, template: Path) -> Chain:
    """The chain ``a`` → ``b`` → ``c`` at ``live`` (see the module's docstring)."""
    chain = Chain(live / "storage", live / "ws", live / "ref")
    copy_of_root(template, chain.storage)
    deeper = chain.ws / "sub" / "deep" / "deeper"
    deeper.mkdir(parents=True)
    chain.ref.mkdir()
    for path, text in [
        (chain.ws / "top.txt", "a's own\n"),
        (chain.ws / "sub" / "s.txt", "b's part\n"),
        (chain.ws / "sub" / "deep" / "d.txt", "c's part\n"),
        (deeper / "leaf.txt", "the leaf\n"),
        (chain.ref / "r.txt", "reference\n"),
    ]:
        path.write_text(text)
        path.chmod(0o644)
    for place in (chain.ws, chain.ws / "sub", chain.ws / "sub" / "deep", deeper):
        place.chmod(0o755)
        os.chown(place, NOBODY, NOBODY)
    chain.ref.chmod(0o755)

    assert chain.ctx("shared", "create", "team", "--group", str(GROUP)).rc == 0
    (chain.storage / "shared" / "team" / "data" / "notes.txt").write_text("team notes\n")
    (chain.storage / "shared" / "team" / "data" / "inner").mkdir()
    provider = chain.storage / "model" / "openai"
    provider.mkdir(mode=0o755)
    for model in (M1, M2):
        (chain.storage / "model" / model).write_text("")
        (chain.storage / "model" / model).chmod(0o644)
        (chain.storage / "model" / f"{model}.d").mkdir(mode=0o755)
        (chain.storage / "model" / f"{model}.d" / "policy").write_text("")
        (chain.storage / "model" / f"{model}.d" / "policy").chmod(0o644)

    chain.create_agent(
        {"name": "a", "label": "a_t", "tools": A_REQUEST_TOOLS, "model": [M1, M2],
         "shared": {"team": ["read", "write"]},
         "mount": [[str(chain.ws), "/workspace", "rw"], [str(chain.ref), "/ref", "ro"]]},
        "--groups", str(GROUP),
    )  # fmt: skip
    chain.allow_tool("a_t", *A_REQUEST_TOOLS)
    chain.allow_model("a_t", M1)
    chain.allow_model("a_t", M2)
    chain.grant("a", "agent:b create", "network:default connect")
    chain.made("a", B_REQUEST)
    chain.may_create("b", "c", "fs.read", "fs.list", "agent.create")
    chain.allow_model("b_t", M1)
    chain.made("b", C_REQUEST)
    chain.allow_tool("c_t", "fs.read", "agent.create")
    chain.allow_model("c_t", M1)
    chain.grant("c", "agent:d create")
    return chain


@pytest.fixture(scope="session")
def _prepared(_template: Path) -> Iterator[tuple[Path, Path]]:
    """The chain made once per test process with ``ctx`` itself, at the very place each
    test's copy goes (``live``), then moved aside (``kept``): every path the controls name
    holds for the copy, and ``cp -a`` keeps the owners of the homes and the workspace."""
    top = new_scratch_dir(SCRATCH, "chain")
    live, kept = top / "live", top / "kept"
    live.mkdir(mode=0o755)
    build(live, _template)
    live.rename(kept)
    yield live, kept
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def chain(_prepared: tuple[Path, Path]) -> Iterator[Chain]:
    live, kept = _prepared
    subprocess.run(["cp", "-a", str(kept), str(live)], check=True)
    yield Chain(live / "storage", live / "ws", live / "ref")
    shutil.rmtree(live, ignore_errors=True)


def grow_d(chain: Chain, **extra) -> dict:
    """``c`` makes ``d``: fs.read and agent.create, the deeper part of its ``/x`` at ``/y``."""
    request = {"name": "d", "label": "d_t", "tools": ["fs.read", "agent.create"],
               "mount": [["/x/deeper", "/y", "ro"]], **extra}  # fmt: skip
    chain.made("c", request)
    chain.allow_tool("d_t", "fs.read", "agent.create")
    return request


# ------------------------------------------------------------ what each level holds


def test_three_levels_each_hold_exactly_their_request_as_the_first_agents_identity(
    chain: Chain,
):
    """A-3, A-4, P-7: ``b`` and ``c`` hold exactly the rules their requests list (one per
    grant, the ``/ctx`` mount's among them), their mounts are the real host paths behind the
    names their creators see them by, and all three run as ``a``'s uid, gid and groups."""
    for agent in ("a", "b", "c"):
        assert chain.identity(agent) == IDENTITY, agent
    assert chain.rules("b") == rules_of(
        "b_t", "tool:fs.read execute", "tool:fs.list execute", "tool:agent.create execute",
        f"model:{M1} use", "shared:team read", "mount:w read", "mount:w write", "mount:r read",
        "mount:ctx read", "agent:c create",
    )  # fmt: skip
    assert chain.rules("c") == rules_of(
        "c_t", "tool:fs.read execute", "tool:agent.create execute", f"model:{M1} use",
        "shared:team read", "mount:x read", "mount:ctx read", "agent:d create",
    )  # fmt: skip
    assert chain.mounts("b") == [
        [str(chain.ws / "sub"), "/w", "rw"], [str(chain.ref), "/r", "ro"],
        [str(chain.storage), "/ctx", "ro"],
    ]  # fmt: skip
    assert chain.mounts("c") == [
        [str(chain.ws / "sub" / "deep"), "/x", "ro"],
        [str(chain.storage), "/ctx", "ro"],
    ]
    assert (chain.controls("c") / "model").read_text() == f"{M1}\n"
    assert (chain.controls("c") / "label").read_text() == "c_t\n"


def test_each_creation_is_recorded_in_the_childs_log_and_its_creators_nowhere_else(
    chain: Chain,
):
    """S-3, docs/sessions.md (``agent.created``: in the child's log and in the parent's,
    there ``object`` is ``agent/<child>``; facts ``by``, ``label``, ``uid``, ``gid``,
    ``parent`` or ``child``): down three levels and then a fourth, each log holds its own
    creation and one line per child it made; the fourth creation touches neither ``a``'s nor
    ``b``'s log."""
    own = {agent: chain.log(agent)[0] for agent in ("a", "b", "c")}
    assert own["a"]["by"] == "ctx agent create" and "parent" not in own["a"], own["a"]
    for child, parent in (("b", "a"), ("c", "b")):
        event = own[child]
        assert set(event) == CREATED_KEYS | {"parent"}, event
        assert (event["type"], event["agent"], event["object"], event["by"]) == (
            "agent.created",
            child,
            f"agent/{child}",
            "agent.create",
        ), event
        assert (event["parent"], event["label"], event["session"]) == (
            parent, f"{child}_t", "grow"), event  # fmt: skip
        assert (event["uid"], event["gid"]) == (NOBODY, NOBODY), event
        told = [e for e in chain.log(parent) if "child" in e]
        assert len(told) == 1 and set(told[0]) == CREATED_KEYS | {"child"}, told
        assert (told[0]["agent"], told[0]["object"], told[0]["child"], told[0]["by"]) == (
            parent, f"agent/{child}", child, "agent.create"), told  # fmt: skip
    assert len(chain.log("c")) == 1
    before = {a: (chain.controls(a) / "log").read_bytes() for a in ("a", "b")}

    grow_d(chain)
    assert {a: (chain.controls(a) / "log").read_bytes() for a in ("a", "b")} == before
    assert chain.children("c") == ["d"]
    assert [(e["agent"], e["parent"], e["label"]) for e in chain.log("d")] == [("d", "c", "d_t")]


def test_each_creation_and_refusal_is_a_tool_call_and_result_in_the_creators_session(
    chain: Chain,
):
    """S-2, T-7, A-4: ``c``'s creations are ordinary ``tool_call``/``tool_result`` pairs in
    the session they ran in — the refused one with status ``error`` — and the child's log
    names that session."""
    refused = chain.create("c", {"name": "d", "label": "d_t", "tools": ["fs.list"]}, "mk")
    assert_refused(refused, "EACCES", "A-4")
    chain.made("c", {"name": "d", "label": "d_t"}, "mk")
    calls = [e for e in chain.events("c", "mk") if e.get("object") == "tool/agent.create"]
    assert [e["type"] for e in calls] == ["tool_call", "tool_result"] * 2, calls
    assert [e["status"] for e in calls if e["type"] == "tool_result"] == ["error", "ok"], calls
    assert len({e["call"] for e in calls}) == 2
    assert {e["agent"] for e in calls} == {"c"}
    assert chain.log("d")[0]["session"] == "mk" and chain.log("c")[-1]["session"] == "mk"


def test_a_chain_six_deep_narrows_at_every_level_and_reads_only_its_own_part(chain: Chain):
    """A-4, A-3: no depth limit is documented, and none is met at six levels.  Each level
    names its mount by its creator's name for it (``/x/deeper`` → ``/y`` → ``/z`` → ``/q``),
    every one recorded as the same real host path; the sixth runs as ``a``'s identity, reads
    the leaf through its mount, and nothing outside it: neither ``c``'s part above nor the
    space ``team`` that ``c`` reads."""
    grow_d(chain)
    chain.grant("d", "agent:e create")
    chain.made("d", {"name": "e", "label": "e_t", "tools": ["fs.read", "agent.create"],
                     "mount": [["/y", "/z", "ro"]]})  # fmt: skip
    chain.may_create("e", "f", "fs.read", "agent.create")
    chain.made("e", {"name": "f", "label": "f_t", "tools": ["fs.read"],
                     "mount": [["/z/", "/q", "ro"]]})  # fmt: skip
    chain.allow_tool("f_t", "fs.read")
    deeper = str(chain.ws / "sub" / "deep" / "deeper")
    for agent, target in (("d", "/y"), ("e", "/z"), ("f", "/q")):
        assert chain.mounts(agent)[0] == [deeper, target, "ro"], agent
        assert chain.identity(agent) == IDENTITY, agent
    assert chain.rules("f") == rules_of("f_t", "tool:fs.read execute", "mount:q read",
                                        "mount:ctx read")  # fmt: skip
    assert [(e["agent"], e.get("parent")) for e in chain.log("f")] == [("f", "e")]
    assert chain.children("e") == ["f"] and chain.children("d") == ["e"]

    rc, frame = chain.run("f", "fs.read", {"path": "/q/leaf.txt"})
    assert rc == 0 and frame["output"]["content"] == "the leaf\n", frame
    for path in ("/x/d.txt", "/ctx/shared/team/data/notes.txt", "/q/../d.txt"):
        rc, frame = chain.run("f", "fs.read", {"path": path})
        assert rc == 1 and frame["status"] == "error", frame
        assert frame["error"]["error"] in ("EACCES", "EINVAL"), frame
        assert "c's part" not in json.dumps(frame) and "team notes" not in json.dumps(frame)


# ------------------------------------------------- a request for more, at the fourth level


def test_tools_only_an_ancestor_holds_are_refused_and_leave_nothing(chain: Chain):
    """A-4, P-6: ``c`` holds fs.read and agent.create; fs.list (``b``'s), fs.stat (``a``'s)
    and shell.exec (nobody's) are each named in one ``EACCES``; nothing appears under
    ``agent/`` or in the home, and no log changes."""
    before = chain.state()
    tools = ["fs.read", "fs.list", "fs.stat", "shell.exec"]
    refused = chain.create("c", {"name": "d", "label": "d_t", "tools": tools})
    assert_refused(refused, "EACCES", "A-4", "c does not hold", "tool:fs.list execute",
                   "tool:fs.stat execute", "tool:shell.exec execute")  # fmt: skip
    assert "tool:fs.read execute" not in message(refused[1])
    assert chain.state() == before


def test_a_model_or_a_space_permission_only_an_ancestor_holds_is_refused(chain: Chain):
    """A-4: ``a`` uses both models and writes ``team``; ``c`` was given one model and read
    only.  A grandchild asking for the other model or for write is refused naming both;
    asking what ``c`` holds gives a policy of exactly that."""
    before = chain.state()
    refused = chain.create("c", {"name": "d", "label": "d_t", "model": [M1, M2],
                                 "shared": {"team": ["read", "write"]}})  # fmt: skip
    assert_refused(refused, "EACCES", "A-4", f"model:{M2} use", "shared:team write")
    assert f"model:{M1} use" not in message(refused[1])
    assert chain.state() == before
    chain.made("c", {"name": "d", "label": "d_t", "model": [M1], "shared": {"team": "read"}})
    assert chain.rules("d") == rules_of("d_t", f"model:{M1} use", "shared:team read",
                                        "mount:ctx read")  # fmt: skip
    assert (chain.controls("d") / "model").read_text() == f"{M1}\n"


def test_mounts_an_ancestor_reaches_but_the_creator_does_not_are_refused(chain: Chain):
    """A-4, docs ctx.agent (every mount inside what the caller's own tools reach, ``rw`` only
    where the caller may write): ``c`` sees ``/x`` read-only.  Its part read-write (which
    ``a`` and ``b`` may write, by the view name or the host path), ``b``'s part, ``a``'s
    workspace and reference, ``b``'s names for its mounts (no mounts of ``c``'s), ``b``'s
    controls and its own read-write (its view shows only its own, read-only) are each named
    by their target in one ``EACCES``; nothing is made."""
    before = chain.state()
    wider = [
        ["/x", "/m1", "rw"],
        [str(chain.ws / "sub" / "deep"), "/m2", "rw"],
        [str(chain.ws / "sub"), "/m3", "ro"],
        [str(chain.ws), "/m4", "ro"],
        [str(chain.ref), "/m5", "ro"],
        ["/w/deep", "/m6", "ro"],
        ["/r", "/m7", "ro"],
        ["/workspace", "/m8", "ro"],
        ["/ctx/agent/b.d", "/m9", "ro"],
        ["/ctx/agent/c.d", "/m10", "rw"],
    ]
    refused = chain.create("c", {"name": "d", "label": "d_t",
                                 "mount": [["/x/deeper", "/ok", "ro"], *wider]})  # fmt: skip
    assert_refused(refused, "EACCES", "A-4",
                   *(f"the mount at {target} ({mode})" for _, target, mode in wider))  # fmt: skip
    assert "/ok" not in message(refused[1])
    assert chain.state() == before


def test_a_space_the_creator_reads_may_be_given_read_only_and_never_read_write(chain: Chain):
    """A-4, T-5: ``c`` reads ``team`` (``a`` writes it): a grandchild may mount the space's
    ``data`` seen through ``c``'s ``/ctx`` read-only, recorded as its host path, but not
    read-write."""
    before = chain.state()
    refused = chain.create("c", {"name": "d", "label": "d_t",
                                 "mount": [["/ctx/shared/team/data", "/t", "rw"]]})  # fmt: skip
    assert_refused(refused, "EACCES", "A-4", "the mount at /t (rw)")
    assert chain.state() == before
    chain.made("c", {"name": "d", "label": "d_t", "mount": [["/ctx/shared/team/data", "/t", "ro"]]})
    assert chain.mounts("d")[0] == [str(chain.storage / "shared" / "team" / "data"), "/t", "ro"]


def test_reach_is_judged_by_the_creators_own_view_not_by_its_ancestors(chain: Chain):
    """A-4, T-5: ``d`` is given part of ``team``'s ``data`` as a mount but no
    ``shared:team``; its own child may have that part by ``d``'s name for it, but neither
    the space's whole ``data`` (which ``a``, ``b`` and ``c`` could give) nor ``shared:team
    read``, though every ancestor reads the space; its ``CTX_PATH`` has none of the space's
    tools, which ``c``'s has."""
    chain.made("c", {"name": "d", "label": "d_t", "tools": ["fs.read", "agent.create"],
                     "mount": [["/ctx/shared/team/data/inner", "/t", "ro"]]})  # fmt: skip
    chain.may_create("d", "e", "fs.read", "agent.create")
    before = chain.state()
    refused = chain.create("d", {"name": "e", "label": "e_t",
                                 "mount": [["/ctx/shared/team/data", "/u", "ro"]]})  # fmt: skip
    assert_refused(refused, "EACCES", "A-4", "d does not hold the mount at /u (ro)")
    refused = chain.create("d", {"name": "e", "label": "e_t", "shared": {"team": "read"}})
    assert_refused(refused, "EACCES", "A-4", "shared:team read")
    assert chain.state() == before
    chain.made("d", {"name": "e", "label": "e_t", "mount": [["/t", "/u", "ro"]]})
    inner = chain.storage / "shared" / "team" / "data" / "inner"
    assert chain.mounts("e")[0] == [str(inner), "/u", "ro"]
    paths = {a: chain.ctx("agent", "show", a, "--json").json()["ctx_path"] for a in "cd"}
    assert paths == {"c": f"/ctx/tool:/ctx/home/{NOBODY}/tool:/ctx/shared/team/tool",
                     "d": f"/ctx/tool:/ctx/home/{NOBODY}/tool"}, paths  # fmt: skip


def test_a_descendant_may_not_mount_its_ancestors_sessions(chain: Chain):
    """A-4, S-6, docs/tools.md (never another agent's directory in a home): ``a`` and ``b``
    recorded the sessions in which they made their children.  ``c`` may not give its child
    ``b``'s or ``a``'s directory, their ``session/`` or one of those sessions; its own
    sessions are its to give."""
    assert (chain.storage / "home" / str(NOBODY) / "agent" / "b" / "session" / "grow").is_dir()
    home = f"/ctx/home/{NOBODY}/agent"
    before = chain.state()
    ancestors = [f"{home}/b", f"{home}/b/session", f"{home}/b/session/grow", f"{home}/a/session",
                 f"{home}/a/session/grow"]  # fmt: skip
    mounts = [[source, f"/p{i}", "ro"] for i, source in enumerate(ancestors)]
    refused = chain.create("c", {"name": "d", "label": "d_t", "mount": mounts})
    assert_refused(refused, "EACCES", "A-4", *(f"the mount at /p{i} (ro)" for i in range(5)))
    assert chain.state() == before
    chain.made("c", {"name": "d", "label": "d_t", "mount": [[f"{home}/c/session", "/p", "ro"]]})
    own = chain.storage / "home" / str(NOBODY) / "agent" / "c" / "session"
    assert chain.mounts("d")[0] == [str(own), "/p", "ro"]


@pytest.mark.parametrize("where", ["space", "home"])
def test_a_mount_where_another_agent_records_sessions_later_is_refused(chain: Chain, where: str):
    """A-4, S-6, docs/tools.md (a child's mount never shows a space or a home's ``agent/`` or
    another agent's directory there: "the sessions other agents record in them later … would
    show through the mount unfiltered"): ``c`` asks for its child a mount of the session that
    ``a`` records in ``team`` later (or that another agent of the chain's uid records in the
    home later).  ``c`` itself is refused that session; its child must be refused the mount
    (EACCES, nothing made), or at least never read the session through it."""
    if where == "space":
        source = "/ctx/shared/team/agent/a/session/plan"
        recorder, options = "a", ("--project", "team", "--session", "plan")
    else:
        source = f"/ctx/home/{NOBODY}/agent/sib/session/plan"
        recorder, options = "sib", ("--session", "plan")
    made = chain.create("c", {"name": "d", "label": "d_t", "tools": ["fs.read"],
                              "mount": [[source, "/p", "ro"]]})  # fmt: skip
    if recorder == "sib":
        chain.create_agent({"name": "sib", "label": "sib_t"})
    recorded = chain.ctx("run", "--agent", recorder, *options, "fs.stat", "PLAN-SECRET")
    assert recorded.rc in (1, 126), recorded
    own_path = source.removeprefix("/ctx/")
    assert "PLAN-SECRET" in (chain.storage / own_path / "events.jsonl").read_text()
    peek = chain.run("c", "fs.read", {"path": f"{source}/events.jsonl"})
    assert peek[1]["error"]["error"] == "EACCES" and "PLAN-SECRET" not in json.dumps(peek[1])
    if made[0] == 0:
        chain.allow_tool("d_t", "fs.read")
        read = chain.run("d", "fs.read", {"path": "/p/events.jsonl"})
        assert "PLAN-SECRET" not in json.dumps(read[1]), read
    assert_refused(made, "EACCES", "A-4", "the mount at /p (ro)")
    assert {"d", "d.d"}.isdisjoint(chain.agents()) and "d" not in chain.homes()


def test_a_refusal_in_terminal_mode_exits_1_with_the_reason_and_a_success_prints_the_child(
    chain: Chain,
):
    """docs/tools.md (``agent.create``: a refusal exits 1, bad input 2), docs ctx.tool
    (terminal mode: the tool's own exit status): ``c`` asking for ``b``'s fs.list gets exit
    1 and ``agent.create: EACCES: … A-4 …`` on stderr, nothing on stdout; a request with a
    field no request has is exit 2 ``EINVAL``; the request it may make prints
    ``created agent d``."""
    before = chain.state()
    wider = json.dumps({"name": "d", "label": "d_t", "tools": ["fs.list"]})
    refused = chain.ctx("run", "--agent", "c", "agent.create", wider)
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err.startswith("agent.create: EACCES: ") and "A-4" in refused.err, refused
    assert "tool:fs.list execute" in refused.err, refused
    smuggled = json.dumps({"name": "d", "label": "d_t", "groups": [0]})
    invalid = chain.ctx("run", "--agent", "c", "agent.create", smuggled)
    assert invalid.rc == 2 and "EINVAL" in invalid.err and "groups" in invalid.err, invalid
    assert chain.state() == before
    made = chain.ctx(
        "run", "--agent", "c", "agent.create", json.dumps({"name": "d", "label": "d_t"})
    )
    assert (made.rc, made.out) == (0, "created agent d\n"), made


def test_grants_no_request_can_carry_never_pass_down(chain: Chain):
    """A-3, A-4, P-4 (no network without the rule), P-7: ``a`` holds ``network:default
    connect`` and ``agent:b create``, added by the host; no field of a request carries them
    (``EINVAL`` naming the field, nothing made), so ``b`` and ``c`` hold neither, and
    ``c`` gets no ``agent:x create`` for holding ``agent.create`` while ``b`` holds that
    grant."""
    chain.grant("b", "agent:x create")
    before = chain.state()
    for key, value in (("network", ["default"]), ("agent", {"x": ["create"]})):
        refused = chain.create("c", {"name": "d", "label": "d_t", key: value})
        assert_refused(refused, "EINVAL", f"'{key}'")
    for agent in ("b", "c"):
        assert not [r for r in chain.rules(agent) if "network:" in r], agent
    explained = chain.ctx("policy", "explain", "c", "network:default", "connect")
    assert explained.rc == 1 and "deny: EACCES: step 5" in explained.out, explained
    refused = chain.create("c", {"name": "x", "label": "x_t"})
    assert_refused(refused, "EACCES", "agent c holds no agent:x create (A-4)")
    assert chain.state() == before


def test_policy_explain_denies_a_descendant_what_only_its_ancestors_hold(chain: Chain):
    """P-5, P-6, A-4: for ``c``, fs.list and model m2 — which ``a`` holds in both layers —
    are denied at step 5 by ``c``'s own policy, even once the host grants ``c_t`` the tool's
    and the model's own layer; what ``c`` was given is allowed."""
    chain.allow_tool("c_t", "fs.list")
    chain.allow_model("c_t", M2)
    for obj, perm in (("tool:fs.list", "execute"), (f"model:{M2}", "use")):
        r = chain.ctx("policy", "explain", "c", obj, perm)
        assert r.rc == 1, r
        rule = f"allow c_t {obj} {perm}"
        assert (
            f"deny: EACCES: step 5 (object policy): agent/c.d/policy has no rule '{rule}'" in r.out
        ), r
    for obj, perm in (("tool:fs.read", "execute"), (f"model:{M1}", "use")):
        r = chain.ctx("policy", "explain", "c", obj, perm)
        assert r.rc == 0 and r.out.rstrip().endswith("allow"), r


# -------------------------------------------------------------------- labels and names


def test_a_descendant_takes_its_creators_label_or_a_new_one_never_an_ancestors(chain: Chain):
    """A-4, docs/tools.md (the child's label is a new one or the caller's own, never the
    label of another existing agent): ``c``'s child may not take ``b_t`` or ``a_t``; it may
    take ``c_t``, with the warning that the label is also ``c``'s."""
    before = chain.state()
    for label, owner in (("b_t", "b"), ("a_t", "a")):
        refused = chain.create("c", {"name": "d", "label": label, "tools": ["fs.read"]})
        assert_refused(refused, "EACCES", "A-4", f"label {label} is agent {owner}'s")
    assert chain.state() == before
    output = chain.made("c", {"name": "d", "label": "c_t", "tools": ["fs.read"]})
    assert output["label"] == "c_t" and output["uid"] == NOBODY, output
    assert [w for w in output["warnings"] if "label c_t is also agent c's" in w], output
    assert chain.rules("d") == rules_of("c_t", "tool:fs.read execute", "mount:ctx read")
    assert chain.log("d")[0]["label"] == "c_t"


def test_siblings_labels_are_another_agents_and_each_sibling_is_logged_once(chain: Chain):
    """A-4, S-3: ``c`` makes three children in turn; the second may not take the first's
    label; ``c``'s log names each child once, in order, and each child's log holds one
    creation naming ``c``.  No count limit is documented, and none is met at three."""
    chain.grant("c", "agent:d2 create", "agent:d3 create")
    chain.made("c", {"name": "d", "label": "d_t"})
    refused = chain.create("c", {"name": "d2", "label": "d_t"})
    assert_refused(refused, "EACCES", "label d_t is agent d's")
    chain.made("c", {"name": "d2", "label": "d2_t"})
    chain.made("c", {"name": "d3", "label": "d3_t", "tools": ["fs.read"]})
    assert chain.children("c") == ["d", "d2", "d3"]
    for child in ("d", "d2", "d3"):
        assert [e.get("parent") for e in chain.log(child)] == ["c"], child


def _c2_with_bs_label(chain: Chain) -> None:
    """``b`` makes ``c2`` under its own label ``b_t``: fs.read and agent.create."""
    chain.grant("b", "agent:c2 create")
    output = chain.made("b", {"name": "c2", "label": "b_t", "tools": ["fs.read", "agent.create"]})
    assert [w for w in output["warnings"] if "label b_t is also agent b's" in w], output


def test_a_label_shared_down_the_chain_carries_the_tool_layer_but_no_agent_grant(
    chain: Chain,
):
    """A-4, P-6, P-7: ``c2`` takes its creator's label ``b_t``: the tools' own policies grant
    by label, so it runs fs.read with no host edit of them; ``agent:<n> create`` is in each
    agent's own policy, so ``b``'s ``allow b_t agent:x create`` gives ``c2`` nothing.  Its
    own child may take ``b_t`` (its creator's own label) but never ``a_t``."""
    _c2_with_bs_label(chain)
    rc, frame = chain.run("c2", "fs.read", {"path": "/ctx/agent/c2.d/label"})
    assert rc == 0 and frame["output"]["content"] == "b_t\n", frame
    chain.grant("b", "agent:x create")
    refused = chain.create("c2", {"name": "x", "label": "x_t"})
    assert_refused(refused, "EACCES", "agent c2 holds no agent:x create (A-4)")
    chain.grant("c2", "agent:d2 create")
    refused = chain.create("c2", {"name": "d2", "label": "a_t"})
    assert_refused(refused, "EACCES", "label a_t is agent a's")
    chain.made("c2", {"name": "d2", "label": "b_t", "tools": ["fs.read"]})
    assert chain.rules("d2") == rules_of("b_t", "tool:fs.read execute", "mount:ctx read")
    assert [e.get("parent") for e in chain.log("d2")] == ["c2"]


def test_narrowing_a_shared_label_narrows_every_agent_that_carries_it(chain: Chain):
    """P-6, A-4, docs ctx.agent (a label shared by two agents shares every grant made to it):
    the host takes ``allow b_t tool:fs.read execute`` out of fs.read's own policy: ``b`` and
    ``c2`` (label ``b_t``) are both denied fs.read at step 6 and ``c2`` may no longer give it;
    ``c`` (its own label) still reads and gives it."""
    _c2_with_bs_label(chain)
    chain.revoke(chain.storage / "tool" / "fs.read.d" / "policy", "allow b_t tool:fs.read execute")
    for agent in ("b", "c2"):
        rc, frame = chain.run(agent, "fs.read", {"path": f"/ctx/agent/{agent}.d/label"})
        assert (rc, frame["error"]["error"], frame["error"]["step"]) == (1, "EACCES", 6), frame
    chain.grant("c2", "agent:d2 create")
    refused = chain.create("c2", {"name": "d2", "label": "d2_t", "tools": ["fs.read"]})
    assert_refused(refused, "EACCES", "A-4", "tool:fs.read execute")
    assert "d2" not in chain.agents()
    rc, frame = chain.run("c", "fs.read", {"path": "/x/d.txt"})
    assert rc == 0 and frame["output"]["content"] == "c's part\n", frame
    chain.made("c", {"name": "d", "label": "d_t", "tools": ["fs.read"]})


def test_a_descendant_may_not_recreate_a_living_ancestor_its_creator_or_itself(chain: Chain):
    """A-3, A-4: at the fourth level, ``d`` granted ``create`` on ``a``, ``b``, ``c`` and
    itself — each with less than they hold, or more than ``d`` holds — gets ``EEXIST`` for
    each: an agent is never overwritten; every control of every one keeps its bytes."""
    grow_d(chain)
    chain.grant("d", *(f"agent:{n} create" for n in ("a", "b", "c", "d")))
    before = chain.state()
    for name, tools in (("a", []), ("b", ["fs.read", "fs.list"]), ("c", []), ("d", ["fs.stat"])):
        refused = chain.create("d", {"name": name, "label": f"{name}_t", "tools": tools})
        assert_refused(refused, "EEXIST", f"agent/{name} already exists", "never overwritten")
    assert chain.state() == before


def test_a_descendant_recreating_a_removed_ancestor_inherits_nothing(chain: Chain):
    """A-4, docs/tools.md (nothing is inherited that the request does not name, nor what an
    earlier agent of the child's name left: its sessions remaining, the create is
    ``EEXIST``): the host removes ``a`` by hand; ``c``, granted ``agent:a create``, is
    refused while ``a``'s sessions stay in the home, and nothing is made.  Once the host
    moved them aside, the loop closes: ``c`` makes a new ``a`` holding only what ``c`` gave
    it — no fs.list, no space write, no network, no grant to create — as ``c``'s identity,
    its log naming ``c``."""
    shutil.rmtree(chain.controls("a"))
    (chain.storage / "agent" / "a").unlink()
    chain.grant("c", "agent:a create")
    before = chain.state()
    request = {"name": "a", "label": "a_t", "tools": ["fs.read"]}
    refused = chain.create("c", request)
    assert_refused(refused, "EEXIST", f"home/{NOBODY}/agent/a", "inherits nothing")
    assert chain.state() == before
    homes = chain.storage / "home" / str(NOBODY) / "agent"
    aside = chain.storage.parent / "a-sessions"
    shutil.move(homes / "a", aside)
    output = chain.made("c", request)
    assert output == {"agent": "a", "label": "a_t", "uid": NOBODY, "warnings": []}, output
    assert chain.rules("a") == rules_of("a_t", "tool:fs.read execute", "mount:ctx read")
    assert chain.mounts("a") == [[str(chain.storage), "/ctx", "ro"]]
    assert chain.identity("a") == IDENTITY
    assert [(e["by"], e.get("parent")) for e in chain.log("a")] == [("agent.create", "c")]
    assert chain.children("c") == ["a"]
    assert (aside / "session" / "grow" / "events.jsonl").is_file()
    assert "a" not in chain.homes()


def test_removing_the_middle_of_a_chain_leaves_its_descendants_whole(chain: Chain):
    """A-4, S-3: the host removes ``b`` by hand.  ``c`` still runs on its own controls —
    reads its part, makes ``d`` — its log still naming ``b``; ``ctx agent list`` shows
    ``a``, ``c`` and ``d`` and no problem; ``a``, granted ``agent:b create``, may not make a
    new ``b`` over the sessions the old one left (``EEXIST``)."""
    shutil.rmtree(chain.controls("b"))
    (chain.storage / "agent" / "b").unlink()
    rc, frame = chain.run("c", "fs.read", {"path": "/x/d.txt"})
    assert rc == 0 and frame["output"]["content"] == "c's part\n", frame
    grow_d(chain)
    assert chain.log("c")[0]["parent"] == "b" and chain.log("d")[0]["parent"] == "c"
    listed = chain.ctx("agent", "list", "--json")
    assert listed.rc == 0, listed
    rows = {row["name"]: row for row in listed.json()}
    assert sorted(rows) == ["a", "c", "d"], rows
    assert all(row["problems"] == [] for row in rows.values()), rows
    before = chain.state()
    refused = chain.create("a", {"name": "b", "label": "b_t"})
    assert_refused(refused, "EEXIST", f"home/{NOBODY}/agent/b")
    assert chain.state() == before


def test_two_creators_at_different_depths_racing_for_one_name_make_one_child(chain: Chain):
    """A-3, A-4, S-3: ``b`` and ``c``, both granted ``agent:x create``, ask for ``x`` at the
    same time with different requests: one ``x`` is made, wholly from one request; the other
    is ``EEXIST``; only the winner's log names ``x``, and ``x``'s log names the winner."""
    chain.grant("b", "agent:x create")
    chain.grant("c", "agent:x create")
    requests = {"b": {"name": "x", "label": "xb_t", "tools": ["fs.list"]},
                "c": {"name": "x", "label": "xc_t", "mount": [["/x", "/in", "ro"]]}}  # fmt: skip
    procs = {by: chain.start(by, "agent.create", req, "race") for by, req in requests.items()}
    outcomes = {by: chain.finish(proc) for by, proc in procs.items()}
    winners = [by for by, (rc, _) in outcomes.items() if rc == 0]
    assert len(winners) == 1, outcomes
    (winner,) = winners
    (loser,) = set(requests) - {winner}
    assert_refused(outcomes[loser], "EEXIST", "never overwritten")
    label = requests[winner]["label"]
    assert chain.label("x") == label
    assert [(e["parent"], e["label"]) for e in chain.log("x")] == [(winner, label)]
    assert chain.children(winner)[-1:] == ["x"] and chain.children(winner).count("x") == 1
    assert "x" not in chain.children(loser)
    if winner == "b":
        assert chain.rules("x") == rules_of(label, "tool:fs.list execute", "mount:ctx read")
    else:
        assert chain.mounts("x")[0] == [str(chain.ws / "sub" / "deep"), "/in", "ro"]


def test_two_creators_asking_at_once_for_one_new_label_make_one_agent_of_it(chain: Chain):
    """A-4, docs/tools.md (the child's label is a new one or the caller's own, never the
    label of another existing agent; creates into ``agent/`` take turns under its
    ``.install-lock`` from their first look to their last step): while the host's own
    create holds the lock, ``b`` asks for ``x1`` and ``c`` for ``x2``, both under the new
    label ``twin_t``.  Once the lock is free, one of them may be made; the other must be
    refused (``EACCES``, the label is the first one's) and nothing of it left."""
    chain.grant("b", "agent:x1 create")
    chain.grant("c", "agent:x2 create")
    lock = os.open(chain.storage / "agent" / ".install-lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        inode = os.fstat(lock).st_ino
        procs = {by: chain.start(by, "agent.create", {"name": name, "label": "twin_t"}, "twin")
                 for by, name in (("b", "x1"), ("c", "x2"))}  # fmt: skip

        def waiting() -> int:
            with open("/proc/locks") as locks:
                return sum(1 for line in locks if "->" in line and f":{inode} " in line)

        wait_for(lambda: waiting() >= 2, 20)
        fcntl.flock(lock, fcntl.LOCK_UN)
        outcomes = {by: chain.finish(proc) for by, proc in procs.items()}
    finally:
        os.close(lock)
    owners = [a for a in chain.agents() if a.endswith(".d") and chain.label(a[:-2]) == "twin_t"]
    assert len(owners) == 1, (owners, outcomes)
    made = [by for by, (rc, _) in outcomes.items() if rc == 0]
    assert len(made) == 1, outcomes
    (refused,) = set(outcomes) - set(made)
    assert_refused(outcomes[refused], "EACCES", "label twin_t is agent")
    lost = {"b": "x1", "c": "x2"}[refused]
    assert {lost, f"{lost}.d"}.isdisjoint(chain.agents()), chain.agents()


def test_the_terminals_workspace_is_no_mount_a_descendant_may_give(chain: Chain):
    """A-4, A-1, docs ctx.agent (the workspace ``ctx agent start`` adds for one terminal is
    not one of the caller's mounts: it is granted for that terminal only, while a child's
    mounts last): in ``c``'s terminal, started with a workspace, ``agent.create`` of a child
    mounting ``/workspace`` is refused (``EACCES`` on the terminal, nothing made); a child
    mounting ``c``'s own ``/x`` is made, its creation recorded in the terminal's session."""
    workspace = chain.storage.parent / "term-ws"
    workspace.mkdir(mode=0o755)
    os.chown(workspace, NOBODY, NOBODY)
    started = chain.ctx("agent", "start", "c", "--session", "term", "--workspace", workspace,
                        "--json")  # fmt: skip
    assert started.rc == 0, started
    try:
        before = chain.state()
        client = Raw(Path(started.json()["socket"]), b"attach\n")
        try:
            assert client.shows("c$ "), client.text()
            wide = {"name": "d", "label": "d_t", "mount": [["/workspace", "/ws", "ro"]]}
            client.type(f"agent.create '{json.dumps(wide)}'")
            assert client.shows("c$ ", 2), client.text()
            assert "agent.create: EACCES: " in client.text(), client.text()
            assert "c does not hold the mount at /ws (ro)" in client.text(), client.text()
            assert chain.state() == before
            own = {"name": "d", "label": "d_t", "mount": [["/x", "/in", "ro"]]}
            client.type(f"agent.create '{json.dumps(own)}'")
            assert client.shows("c$ ", 3), client.text()
            assert "created agent d" in client.text(), client.text()
        finally:
            client.close()
    finally:
        stopped = chain.ctx("agent", "stop", "c", "--session", "term")
        assert stopped.rc == 0, stopped
    assert chain.mounts("d")[0] == [str(chain.ws / "sub" / "deep"), "/in", "ro"]
    assert [(e["parent"], e["session"]) for e in chain.log("d")] == [("c", "term")]


def test_names_and_labels_collide_across_chains_of_different_uids(
    chain: Chain, unprivileged_user: UnprivilegedUser
):
    """A-3, A-4, P-5 step 1: the host makes ``z``, running as another user, with
    agent.create.  Its child runs as that user, never as ``a``'s chain's uid nor root's
    default; it may take no name of ``a``'s chain (``EEXIST``) and no label of it
    (``EACCES``)."""
    user = unprivileged_user
    chain.create_agent({"name": "z", "label": "z_t", "tools": ["agent.create"]},
                       "--user", str(user.uid))  # fmt: skip
    chain.may_create("z", "zc", "agent.create")
    chain.grant("z", "agent:c create")
    before = chain.state()
    assert_refused(chain.create("z", {"name": "c", "label": "zc_t"}), "EEXIST", "agent/c")
    assert_refused(chain.create("z", {"name": "zc", "label": "c_t"}), "EACCES", "label c_t")
    assert chain.state() == before
    output = chain.made("z", {"name": "zc", "label": "zc_t"})
    assert output["uid"] == user.uid, output
    assert chain.identity("zc") == chain.identity("z")
    assert chain.identity("zc")["uid"] == user.uid != NOBODY
    assert [(e["uid"], e["parent"]) for e in chain.log("zc")] == [(user.uid, "z")]


# ------------------------------------------------ an ancestor narrowed or damaged afterwards


def test_narrowing_an_ancestor_leaves_its_descendants_the_grants_they_were_given(
    chain: Chain,
):
    """A-4 (grants are explicit and per child name; nothing is inherited), docs ctx.agent
    (a child's mounts last): the host takes fs.read and the ``/w`` mount out of ``b``'s
    policy and group 100 out of ``a``'s identity.  ``b`` may no longer read or give them
    (``EACCES`` naming each); ``c`` keeps its own controls — reads its part, and gives its
    child fs.read and part of ``/x`` as its own identity, group 100 included."""
    policy = chain.controls("b") / "policy"
    chain.revoke(policy, "allow b_t tool:fs.read execute", "allow b_t mount:w read",
                 "allow b_t mount:w write")  # fmt: skip
    (chain.controls("a") / "identity").write_text('{"uid": 65534, "gid": 65534, "groups": []}\n')
    rc, frame = chain.run("b", "fs.read", {"path": "/ctx/agent/b.d/label"})
    assert (rc, frame["error"]["error"], frame["error"]["step"]) == (1, "EACCES", 5), frame
    chain.grant("b", "agent:c3 create")
    refused = chain.create("b", {"name": "c3", "label": "c3_t", "tools": ["fs.read"],
                                 "mount": [["/w", "/v", "ro"]]})  # fmt: skip
    assert_refused(refused, "EACCES", "A-4", "tool:fs.read execute", "the mount at /v (ro)")
    assert "c3" not in chain.agents()
    rc, frame = chain.run("c", "fs.read", {"path": "/x/d.txt"})
    assert rc == 0 and frame["output"]["content"] == "c's part\n", frame
    grow_d(chain)
    assert chain.identity("d") == IDENTITY and chain.identity("c") == IDENTITY
    assert chain.mounts("d")[0] == [str(chain.ws / "sub" / "deep" / "deeper"), "/y", "ro"]


def test_a_damaged_ancestor_policy_stops_only_that_ancestor(chain: Chain):
    """P-2, P-5, A-4: the host writes a glob into ``a``'s policy; ``a``'s policy is invalid
    and grants nothing, so its own ``agent.create`` is refused at step 5 naming the glob,
    before the tool starts; ``ctx agent list`` names the problem; ``b`` and ``c`` are
    untouched and ``c`` still makes its child."""
    chain.grant("a", "agent:* create")
    chain.grant("a", "agent:b2 create")
    before = chain.state()
    rc, frame = chain.create("a", {"name": "b2", "label": "b2_t"})
    assert (rc, frame["error"]["error"], frame["error"]["step"]) == (1, "EACCES", 5), frame
    assert frame["error"]["stage"] == "authorize" and frame["exit_status"] is None, frame
    assert "agent:*" in message(frame), frame
    assert chain.state() == before
    listed = {row["name"]: row for row in chain.ctx("agent", "list", "--json").json()}
    assert listed["a"]["problems"] and listed["b"]["problems"] == listed["c"]["problems"] == []
    grow_d(chain)
    assert chain.identity("d") == IDENTITY


def test_a_damaged_middle_identity_stops_only_that_agent(chain: Chain):
    """P-5 step 1, docs/policy.md (a damaged identity is reported naming the file): ``b``'s
    identity is cut short; its ``agent.create`` is refused (exit 126 in terminal mode,
    ``EACCES`` naming ``agent/b.d/identity``) and nothing is made; ``c``, which holds an
    identity of its own, makes its child as that identity."""
    (chain.controls("b") / "identity").write_text('{"uid": 65534, "gid": 65534')
    chain.grant("b", "agent:c3 create")
    before = chain.state()
    refused = chain.ctx("run", "--agent", "b", "agent.create", '{"name": "c3", "label": "c3_t"}')
    assert refused.rc == 126, refused
    assert "EACCES" in refused.err and "agent/b.d/identity is invalid" in refused.err, refused
    assert chain.state() == before
    grow_d(chain)
    assert chain.identity("d") == IDENTITY


def test_an_ancestors_place_moved_away_stops_the_descendants_on_it_until_it_is_back(
    chain: Chain,
):
    """A-4 (a child's mounts last, as the real paths checked), docs ctx.tool (``CTX_CWD``: the
    first visible mount): the host moves ``sub/`` out of ``a``'s workspace.  ``b`` and ``c``,
    whose mounts name it, are refused every call (``ENOENT`` naming their mount control,
    nothing made); ``a``, whose workspace is still there, still creates; once ``sub/`` is
    back, ``c`` makes its child."""
    moved = chain.ws / "sub-moved"
    (chain.ws / "sub").rename(moved)
    chain.grant("b", "agent:c3 create")
    chain.grant("a", "agent:b2 create")
    before = chain.state()
    for by, name, at in (("b", "c3", "/w"), ("c", "d", "/x")):
        rc, frame = chain.create(by, {"name": name, "label": f"{name}_t"})
        assert (rc, frame["error"]["error"], frame["exit_status"]) == (1, "ENOENT", None), frame
        assert f"fix the mount at {at} in agent/{by}.d/mount" in message(frame), frame
    assert chain.state() == before
    chain.made("a", {"name": "b2", "label": "b2_t", "mount": [["/workspace", "/w2", "ro"]]})
    moved.rename(chain.ws / "sub")
    grow_d(chain)


def test_a_creator_whose_log_cannot_be_written_still_makes_a_whole_child_and_says_so(
    chain: Chain,
):
    """S-3, S-5, docs/tools.md (the pair appears atomically, its log already holding the
    ``agent.created`` record): ``c``'s log has been replaced by a directory.  ``d`` is made
    whole, its own log holds its creation, and the output's warnings say that ``c``'s log
    could not be written."""
    log = chain.controls("c") / "log"
    log.unlink()
    log.mkdir()
    output = chain.made("c", {"name": "d", "label": "d_t", "tools": ["fs.read"]})
    assert [w for w in output["warnings"] if "agent c's log could not be written" in w], output
    assert [(e["agent"], e["parent"]) for e in chain.log("d")] == [("d", "c")]
    assert chain.rules("d") == rules_of("d_t", "tool:fs.read execute", "mount:ctx read")
    assert log.is_dir() and os.listdir(log) == []


def test_bootstrap_after_a_chain_leaves_every_agent_as_it_was(chain: Chain):
    """R-5 (idempotent, never destroys user data): ``ctx bootstrap`` over a root holding a
    chain four deep changes no byte under ``agent/``, and the chain goes on growing."""
    grow_d(chain)
    before = chain.state()
    r = chain.ctx("bootstrap", "--storage", chain.storage)
    assert r.rc == 0, r
    assert chain.state() == before
    chain.grant("d", "agent:e create")
    chain.made("d", {"name": "e", "label": "e_t", "mount": [["/y", "/z", "ro"]]})
