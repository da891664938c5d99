"""A hostile parent agent on a root host: agent ``parent`` (uid ``nobody``, group 100) holds
``agent.create`` and ``agent:kid create`` and uses that one door to get more than it has —
tools, spaces and models it lacks in any spelling, wildcard-looking and duplicate entries,
mounts widened by ``..``, ``.``, trailing slashes, planted links, a directory above its own,
``rw`` over ``ro``, the storage root and its raw ``agent/``; names it holds no grant for,
names of existing agents and of itself, leftovers under ``agent/``; smuggled identity,
policy and prompt fields; a request over the host's limit; concurrent creates of one name;
its grant revoked while the call runs; a grandchild widening what the child holds; a name
reused to inherit sessions, a mount of its home that later shows other agents' sessions,
control bytes in what the host prints for it.  Every refusal must carry the errno and the
clause, leave nothing half-made under ``agent/``, and be recorded as tool_call/tool_result;
every child must hold no more than A-4 allows, as its controls and its own tool calls show."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    read_jsonl,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")

NOBODY = 65534
GROUP = 100  # the parent's one supplementary group (users)
PARENT_TOOLS = ("fs.read", "fs.list", "agent.create")
KID = {"name": "kid", "label": "kid_t"}
# What an A-4 refusal lists: each grant with its reason in parentheses, each mount alone.
MISSING = re.compile(
    r"(?:does not hold |; )((?:tool|model|shared):\S+ \w+(?= \()|the mount at \S+ \(\w+\)(?=;|$))"
)


@dataclass
class World(OnStorage):
    storage: Path
    ws: Path  # the parent's /workspace (rw), owned by its uid
    ref: Path  # the parent's /ref (ro), root's
    secret: Path  # a host directory outside every mount of the parent
    outbox: Path  # every uid may write here

    def controls(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d"

    def agents(self) -> list[str]:
        """Every entry of ``agent/``, hidden ones included (a staged half of a pair would be)."""
        return sorted(os.listdir(self.storage / "agent"))

    def grant(self, agent: str, *rules: str, label: str | None = None) -> None:
        with (self.controls(agent) / "policy").open("a") as policy:
            for rule in rules:
                policy.write(f"allow {label or agent + '_t'} {rule}\n")

    def revoke(self, policy: Path, rule: str) -> None:
        kept = [line for line in policy.read_text().splitlines(True) if line.strip() != rule]
        policy.write_text("".join(kept))

    def start(self, agent: str, tool: str, value, session: str) -> subprocess.Popen:
        argv = [*CTX_ARGV, "run", "--agent", agent, "--native", "--session", session, tool]
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        text = value if isinstance(value, str) else json.dumps(value)
        proc.stdin.write(text.encode())
        proc.stdin.close()
        proc.stdin = None  # all written: communicate() only reads
        return proc

    def calls(self, calls: list[tuple[str, str, object]], session: str) -> list[tuple[int, dict]]:
        """``ctx run --agent A --native --session SESSION TOOL`` for each ``(A, TOOL, input)``,
        all started together; each exit status with its ``result`` frame."""
        procs = [self.start(agent, tool, value, session) for agent, tool, value in calls]
        done = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            lines = out.decode().splitlines()
            frame = json.loads(lines[-1]) if lines else {"stderr": err.decode()}
            done.append((proc.returncode, frame))
        return done

    def native(
        self, requests: list, session: str, agent: str = "parent", tool: str = "agent.create"
    ) -> list[tuple[int, dict]]:
        """:meth:`calls` of one agent's one tool, ``agent.create`` by ``parent`` by default."""
        return self.calls([(agent, tool, value) for value in requests], session)

    def events(self, agent: str, session: str) -> list[dict]:
        home = self.storage / "home" / str(NOBODY) / "agent" / agent / "session" / session
        return read_jsonl(home / "events.jsonl")

    def rules(self, agent: str) -> list[str]:
        text = (self.controls(agent) / "policy").read_text()
        return sorted(line for line in text.splitlines() if line.startswith("allow"))


def reason(frame: dict) -> tuple[str | None, str]:
    error = frame.get("error") or {}
    return error.get("error"), error.get("message", "")


def assert_refused(outcome: tuple[int, dict], expected: str, *words: str) -> None:
    """Refused with ``expected``: EINVAL as bad input (the runner's schema stage, exit 2,
    never started; or the tool's own exit 2), anything else as a refusal (exit 1)."""
    rc, frame = outcome
    code, message = reason(frame)
    assert frame.get("status") == "error" and code == expected, (expected, frame)
    if expected == "EINVAL":
        assert (rc, frame["exit_status"]) in {(2, None), (1, 2)}, frame
    else:
        assert (rc, frame["exit_status"]) == (1, 1), frame
    for word in words:
        assert word in message, (word, frame)


def missing(outcome: tuple[int, dict]) -> set[str]:
    """The grants an A-4 refusal says the creator does not hold, each named before its
    reason in parentheses."""
    return set(MISSING.findall(reason(outcome[1])[1]))


def assert_recorded(world: World, session: str, count: int, status: str = "error") -> None:
    """S-2, T-7: each call of agent.create in ``session`` is one tool_call and one tool_result
    with the same call id, the result with ``status``."""
    calls = [e for e in world.events("parent", session) if e.get("object") == "tool/agent.create"]
    kinds = sorted((e["call"], e["type"]) for e in calls)
    ids = {e["call"] for e in calls}
    assert len(ids) == count and kinds == sorted(
        (i, kind) for i in ids for kind in ("tool_call", "tool_result")
    ), calls
    assert {e["status"] for e in calls if e["type"] == "tool_result"} == {status}, calls


def lay_out(top: Path, template: Path) -> World:
    """The storage root (a copy of ``template``) and the host directories of :func:`world`
    under ``top``."""
    w = World(top / "storage", top / "ws", top / "ref", top / "secret", top / "outbox")
    copy_of_root(template, w.storage)
    for place in (w.ws, w.ref, w.secret, w.outbox):
        place.mkdir(mode=0o755)
    w.outbox.chmod(0o1777)
    (w.ws / "sub").mkdir()
    (w.ws / "sub" / "b.txt").write_text("sub data\n")
    (w.ws / "group.txt").write_text("for group 100\n")
    (w.ws / "root-group.txt").write_text("for group 0\n")
    (w.ref / "r.txt").write_text("reference\n")
    (w.secret / "s.txt").write_text("TOPSECRET\n")
    for path in (w.ws / "group.txt", w.ws / "root-group.txt"):
        path.chmod(0o640)
    for path in (w.ws / "sub" / "b.txt", w.ref / "r.txt", w.secret / "s.txt"):
        path.chmod(0o644)
    return w


def give_workspace(w: World) -> None:
    """The workspace is the parent's uid's; one file of it is group 100's (copies are root's)."""
    for path in (w.ws, w.ws / "sub", w.ws / "sub" / "b.txt"):
        os.chown(path, NOBODY, NOBODY)
    os.chown(w.ws / "group.txt", 0, GROUP)


@pytest.fixture(scope="session")
def _prepared(_template: Path) -> Iterator[tuple[Path, Path]]:
    """Made once per test process with ``ctx`` itself, at the very place each test's copy
    goes (``live``), then moved aside (``kept``): every path the controls name holds for the
    copy.  ``parent`` (nobody, groups [100]) with fs.read, fs.list and agent.create in both
    layers, its workspace read-write at /workspace and a reference directory read-only at
    /ref, and ``agent:kid create``; ``sib``, another agent of the same uid (root's agents
    all run as nobody), allowed fs.read."""
    top = Path(tempfile.mkdtemp(prefix="ctx-hostile-parent-", dir="/tmp"))
    top.chmod(0o755)
    live, kept = top / "live", top / "kept"
    live.mkdir(mode=0o755)
    w = lay_out(live, _template)
    give_workspace(w)
    w.create_agent(
        {"name": "parent", "label": "parent_t", "tools": list(PARENT_TOOLS),
         "mount": [[str(w.ws), "/workspace", "rw"], [str(w.ref), "/ref", "ro"]]},
        "--groups", str(GROUP),
    )  # fmt: skip
    # Root's default identity: nobody.
    w.create_agent({"name": "sib", "label": "sib_t", "tools": ["fs.read"]})
    w.allow_tool("parent_t", *PARENT_TOOLS)
    w.allow_tool("sib_t", "fs.read")
    w.grant("parent", "agent:kid create")
    live.rename(kept)
    yield live, kept
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(_prepared: tuple[Path, Path]) -> Iterator[World]:
    """A fresh copy of the prepared root and directories (see :func:`_prepared`)."""
    live, kept = _prepared
    shutil.copytree(kept, live, symlinks=True)
    w = World(live / "storage", live / "ws", live / "ref", live / "secret", live / "outbox")
    give_workspace(w)
    yield w
    shutil.rmtree(live, ignore_errors=True)


def with_agents(*names: str) -> list[str]:
    """What ``agent/`` holds with ``names`` made besides the two agents every test has."""
    made = [f"{name}{suffix}" for name in names for suffix in ("", ".d")]
    return sorted([".install-lock", "parent", "parent.d", "sib", "sib.d", *made])


def plant_link(world: World, name: str, target: Path | str) -> None:
    """A symbolic link in the parent's workspace, owned by the parent's uid as if it made it."""
    link = world.ws / name
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)


# ------------------------------------------------------------------- what a child may get


def test_a_child_of_part_of_the_parents_grants_holds_exactly_them_as_the_parents_identity(
    world: World,
):
    """A-4, A-3, P-5 step 4, S-3: a child with one tool and part of the parent's workspace
    (named as the parent sees it, trailing slash and all) runs as the parent's uid, gid and
    groups and no others — its own fs.read reads a group-100 file, not a group-0 one, nor the
    parent's ``/ref`` outside its mount; its controls hold exactly the request, are root's
    and cannot be changed by the uid it shares with its parent; its entry and controls
    appear together."""
    made = world.native([{**KID, "tools": ["fs.read"], "mount": [["/workspace/", "/data", "ro"]]}],
                        "ok")  # fmt: skip
    assert made[0][0] == 0 and made[0][1]["output"]["uid"] == NOBODY, made
    assert_recorded(world, "ok", 1, status="ok")
    assert world.agents() == with_agents("kid")

    identities = [
        json.loads((world.controls(a) / "identity").read_text()) for a in ("kid", "parent")
    ]
    assert identities == [{"uid": NOBODY, "gid": NOBODY, "groups": [GROUP]}] * 2, identities
    assert world.rules("kid") == sorted(["allow kid_t tool:fs.read execute",
                                         "allow kid_t mount:data read",
                                         "allow kid_t mount:ctx read"])  # fmt: skip
    assert json.loads((world.controls("kid") / "mount").read_text()) == [
        [str(world.ws), "/data", "ro"], [str(world.storage), "/ctx", "ro"]]  # fmt: skip
    assert (world.controls("kid") / "model").read_text() == ""
    for control in world.controls("kid").iterdir():
        status = control.lstat()
        mode = 0o640 if control.name == "log" else 0o644
        assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (0, mode), control
    entry = (world.storage / "agent" / "kid").stat()
    assert (entry.st_uid, stat.S_IMODE(entry.st_mode)) == (0, 0o755)
    tamper = subprocess.run(
        ["/bin/sh", "-c", f"echo 'allow kid_t agent:x create' >> {world.controls('kid')}/policy"],
        user=NOBODY, group=NOBODY, extra_groups=[GROUP], capture_output=True, text=True,
    )  # fmt: skip
    assert tamper.returncode != 0 and "ermission denied" in tamper.stderr, tamper

    world.allow_tool("kid_t", "fs.read")
    paths = ["/data/group.txt", "/data/root-group.txt", "/ref/r.txt"]
    reads = world.native([{"path": p} for p in paths], "reads", agent="kid", tool="fs.read")
    assert reads[0][1]["output"]["content"] == "for group 100\n", reads[0]
    for rc, frame in reads[1:]:
        assert (rc, reason(frame)[0]) == (1, "EACCES"), frame
        assert "for group 0" not in json.dumps(frame) and "reference" not in json.dumps(frame)


def test_tools_spaces_and_models_beyond_the_parents_in_any_spelling_are_refused(world: World):
    """A-4, P-2, P-3, P-6, P-7, R-3: the parent holds fs.read, ``shared:team read`` and model
    ``openai/gpt-5.6`` in both layers, and names fs.stat and ``openai/gpt-5.7`` in its own
    policy only.  One request for tools, spaces and models beyond that — another tool, those
    two its other layer denies, case variants, a space's ``write``, another space — is EACCES
    naming each of them and A-4; one of only malformed entries — a Cyrillic letter, globs, a
    duplicate, a trailing blank, rules smuggled after a line end, an upper-case permission —
    is EINVAL counting each.  Nothing is made, each call is recorded; asking exactly what
    the parent holds gives a policy of exactly those rules."""
    assert world.ctx("shared", "create", "team", "--group", str(GROUP)).rc == 0
    models = world.storage / "model" / "openai"
    for name in ("gpt-5.6", "gpt-5.7"):
        (models / f"{name}.d").mkdir(parents=True)
        (models / name).write_text("")
        (models / name).chmod(0o644)
    (models / "gpt-5.6.d" / "policy").write_text("allow parent_t model:openai/gpt-5.6 use\n")
    (models / "gpt-5.7.d" / "policy").write_text("allow other_t model:openai/gpt-5.7 use\n")
    world.grant("parent", "tool:fs.stat execute", "shared:team read",
                "model:openai/gpt-5.6 use", "model:openai/gpt-5.7 use")  # fmt: skip
    before = world.agents()
    wider = {**KID, "tools": ["fs.read", "shell.exec", "fs.stat", "FS.READ"],
             "shared": {"team": "read write", "proj": ["read"], "Team": ["read"]},
             "model": ["openai/gpt-5.7", "OpenAI/gpt-5.6"]}  # fmt: skip
    malformed = {**KID, "tools": ["fs.re\u0430d", "*", "fs.*", "fs.read ",
                                  "fs.read execute\nallow kid_t tool:shell.exec"],
                 "shared": {"*": "read", "team": ["read", "read"], "TEAM": ["READ"],
                            "Team": "read\nallow kid_t tool:shell.exec execute"},
                 "model": ["openai/*"]}  # fmt: skip
    refused, invalid = world.native([wider, malformed], "grants")
    assert_refused(refused, "EACCES", "A-4")
    assert missing(refused) == {
        "tool:shell.exec execute", "tool:fs.stat execute", "tool:FS.READ execute",
        "shared:team write", "shared:proj read", "shared:Team read",
        "model:openai/gpt-5.7 use", "model:OpenAI/gpt-5.6 use",
    }, reason(refused[1])  # fmt: skip
    # The first problem named, the rest counted: five tools, one model, and for the spaces
    # the glob, the duplicate, READ and each of the four words after the line end.
    assert_refused(invalid, "EINVAL", "(and 12 more)")
    assert world.agents() == before
    assert_recorded(world, "grants", 2)
    assert not [e for e in read_jsonl(world.controls("parent") / "log") if e.get("child")]

    made = world.native([{**KID, "tools": ["fs.read"], "shared": {"team": "read"},
                          "model": ["openai/gpt-5.6"]}], "ok")  # fmt: skip
    assert made[0][0] == 0, made
    assert world.rules("kid") == sorted(["allow kid_t tool:fs.read execute",
                                         "allow kid_t shared:team read",
                                         "allow kid_t model:openai/gpt-5.6 use",
                                         "allow kid_t mount:ctx read"])  # fmt: skip
    assert (world.controls("kid") / "model").read_text() == "openai/gpt-5.6\n"


# ------------------------------------------------------------------------------- mounts


def test_mounts_wider_than_the_parents_by_any_path_trick_are_refused(world: World):
    """A-4, A-3, T-5: ``rw`` over its ``ro`` mount (with doubled and trailing slashes), a
    directory above its workspace (also through a planted ``..`` link), ``/``, links it
    planted in its workspace to its ``ro`` mount, to ``/etc`` and to the raw ``agent/``,
    ``/proc/self/root``, ``/ctx/agent`` (its view shows it only itself there) and the host
    path of ``agent/``: one EACCES naming each mount by its target (never where a link led)
    and A-4.  ``..``, a link to the storage root, ``/ctx`` itself and two mounts of one name:
    EINVAL, each counted.  Nothing is made."""
    plant_link(world, "to-ref", world.ref)
    plant_link(world, "to-etc", "/etc")
    plant_link(world, "to-root", world.storage)
    plant_link(world, "to-agents", world.storage / "agent")
    plant_link(world, "up", "..")
    before = world.agents()
    wider = [
        ["//ref//", "/m1", "rw"],
        [str(world.ws.parent), "/m2", "ro"],
        ["/workspace/up", "/m3", "ro"],
        ["/", "/m4", "ro"],
        ["/workspace/to-ref", "/m5", "rw"],
        ["/workspace/to-etc", "/m6", "ro"],
        ["/workspace/to-agents", "/m7", "ro"],
        ["/proc/self/root", "/m8", "ro"],
        ["/ctx/agent", "/m9", "ro"],
        [str(world.storage / "agent"), "/m10", "ro"],
    ]
    malformed = [
        ["/workspace/sub/../..", "/n1", "ro"],
        ["/workspace/to-root", "/n2", "ro"],
        ["/ctx", "/n3", "ro"],
        ["/workspace", "/a/w", "ro"],
        ["/ref", "/b/w", "ro"],
    ]
    refused, invalid = world.native(
        [{**KID, "mount": [["/workspace/sub", "/ok", "ro"], *wider]},
         {**KID, "mount": malformed}], "mounts")  # fmt: skip
    targets = [f"the mount at {target} ({mode})" for _, target, mode in wider]
    assert_refused(refused, "EACCES", "A-4", *targets)
    message = reason(refused[1])[1]
    assert "/ok" not in message and "/etc" not in message and "/agent" not in message, message
    assert_refused(invalid, "EINVAL", "'..'", "(and 3 more)")
    assert world.agents() == before
    assert_recorded(world, "mounts", 2)


def test_a_dot_component_in_a_mount_source_is_refused_however_the_source_is_named(
    world: World,
):
    """A-3, docs ctx.agent ("Mount paths are absolute, without ``.`` or ``..``
    components"): ``ws/./sub`` given as a host path is EINVAL; the same place given as the
    parent sees it, ``/workspace/./sub``, must be refused alike, and nothing is made."""
    host, view = world.native(
        [{**KID, "mount": [[f"{world.ws}/./sub", "/d", "ro"]]},
         {**KID, "mount": [["/workspace/./sub", "/d", "ro"]]}],
        "dot",
    )  # fmt: skip
    assert_refused(host, "EINVAL", "'.'")
    assert_refused(view, "EINVAL", "'.'")
    assert "kid" not in world.agents()


def test_a_child_mount_of_the_parents_home_never_shows_sessions_recorded_there_later(
    world: World,
):
    """A-4, S-6, T-5: the parent's view of its home hides the sessions of the other agents of
    its uid.  A child mounting that home (accepted while nothing else is there, or refused)
    must not read, through that mount, the session ``sib`` (same uid) records there
    afterwards — the parent itself is refused the same file."""
    made = world.native([{**KID, "tools": ["fs.read"],
                          "mount": [[f"/ctx/home/{NOBODY}", "/h", "ro"]]}], "home")  # fmt: skip
    recorded = world.ctx("run", "--agent", "sib", "--session", "notes", "fs.stat",
                         "LATER-SECRET")  # fmt: skip
    assert recorded.rc != 0, recorded  # not granted, and recorded all the same
    events = "agent/sib/session/notes/events.jsonl"
    assert "LATER-SECRET" in (world.storage / "home" / str(NOBODY) / events).read_text()
    world.allow_tool("kid_t", "fs.read")
    parents, read = world.calls([("parent", "fs.read", {"path": f"/ctx/home/{NOBODY}/{events}"}),
                                 ("kid", "fs.read", {"path": f"/h/{events}"})], "peek")  # fmt: skip
    assert reason(parents[1])[0] == "EACCES", parents
    if made[0][0] != 0:
        assert_refused(made[0], "EACCES", "A-4")
        return
    assert "LATER-SECRET" not in json.dumps(read[1]), read
    assert reason(read[1])[0] == "EACCES", read


# -------------------------------------------------------------------------------- names


def test_only_an_exact_create_grant_in_the_parents_own_policy_names_a_child(world: World):
    """A-4, P-2, P-7, R-3: holding ``agent:kid create`` makes no ``KID`` or ``kid2`` (EACCES
    naming the missing grant and A-4), though the parent holds every other permission on
    ``agent:kid2``, a create grant for it under another subject, one in agent.create's own
    policy and one commented out; illegal names (a Cyrillic letter, the ``.d`` of a control
    directory, the tier's lock file) are EINVAL; nothing is made and every call is recorded."""
    world.grant("parent", *(f"agent:kid2 {p}" for p in ("start", "stop", "read", "write")))
    world.grant("parent", "agent:kid2 create", label="other_t")
    with (world.controls("parent") / "policy").open("a") as policy:
        policy.write("# allow parent_t agent:kid2 create\n")
    with (world.storage / "tool" / "agent.create.d" / "policy").open("a") as policy:
        policy.write("allow parent_t agent:kid2 create\n")
    before = world.agents()
    ungranted = ["KID", "kid2"]
    illegal = ["k\u0456d", "kid.d", ".install-lock"]
    runs = world.native([{"name": n, "label": "x_t"} for n in ungranted + illegal], "names")
    for name, outcome in zip(ungranted, runs, strict=False):
        assert_refused(outcome, "EACCES", f"holds no agent:{name} create (A-4)")
    for outcome in runs[len(ungranted) :]:
        assert_refused(outcome, "EINVAL", "name: ")
    assert world.agents() == before
    assert_recorded(world, "names", len(ungranted) + len(illegal))


def test_a_wildcard_create_grant_grants_nothing_and_stops_every_call(world: World):
    """P-2, A-4: ``allow parent_t agent:* create`` is no grant; the invalid policy denies the
    call at step 5 before anything runs, naming the glob, and no agent appears."""
    world.grant("parent", "agent:* create")
    before = world.agents()
    runs = world.native([{"name": n, "label": f"{n}_t"} for n in ("kid", "star")], "glob")
    for rc, frame in runs:
        assert (rc, reason(frame)[0], frame["error"]["stage"]) == (1, "EACCES", "authorize")
        assert frame["error"]["step"] == 5 and "agent:*" in reason(frame)[1], frame
        assert frame["exit_status"] is None, frame  # never started
    assert world.agents() == before
    assert_recorded(world, "glob", 2)


def test_an_existing_agent_or_the_parent_itself_is_never_overwritten(world: World):
    """A-3, A-4: granted ``create`` on an existing agent (``sib``), on itself and on a
    name differing from the existing one only by case, the parent gets EEXIST for the two
    existing names — with more tools than it holds too — and both keep every byte; the case
    variant is a new agent of its own that may not take the existing agent's label, and the
    existing agent stays as it was."""
    world.grant("parent", "agent:sib create", "agent:parent create", "agent:Sib create")
    kept = {a: snapshot(world.controls(a)) for a in ("sib", "parent")}
    entries = {a: (world.storage / "agent" / a).read_bytes() for a in ("sib", "parent")}
    cases = [
        ({"name": "sib", "label": "s_t", "tools": ["fs.read"]}, "EEXIST"),
        ({"name": "parent", "label": "parent_t", "tools": [*PARENT_TOOLS, "shell.exec"]},
         "EEXIST"),
        ({"name": "Sib", "label": "sib_t"}, "EACCES"),
    ]  # fmt: skip
    runs = world.native([request for request, _ in cases], "exists")
    for (_, expected), outcome in zip(cases, runs, strict=True):
        assert_refused(outcome, expected, "never overwritten" if expected == "EEXIST" else "A-4")
    made = world.native([{"name": "Sib", "label": "s2_t", "tools": ["fs.read"]}], "exists")
    assert made[0][0] == 0 and made[0][1]["output"]["uid"] == NOBODY, made
    assert snapshot(world.controls("sib")) == kept["sib"]
    parent_now = snapshot(world.controls("parent"))
    assert {k: v for k, v in parent_now.items() if k != "log"} == {
        k: v for k, v in kept["parent"].items() if k != "log"
    }
    assert [e.get("child") for e in read_jsonl(world.controls("parent") / "log")] == [
        None, "Sib"]  # fmt: skip
    assert {a: (world.storage / "agent" / a).read_bytes() for a in entries} == entries
    calls = [e for e in world.events("parent", "exists") if e["type"] == "tool_result"]
    assert sorted(e["status"] for e in calls) == ["error"] * len(cases) + ["ok"], calls


def test_leftover_controls_or_an_entry_under_the_childs_name_are_never_adopted(world: World):
    """A-3, A-4: a ``kid.d/`` left without its entry (holding a wider policy) and a ``kid``
    entry left without controls are both EEXIST, saying what is there; the leftover keeps
    its bytes and no second half is added to it."""
    left = world.controls("kid")
    left.mkdir()
    (left / "policy").write_text("allow kid_t tool:shell.exec execute\n")
    kept = snapshot(left)
    first = world.native([{**KID, "tools": ["fs.read"]}], "left")
    assert_refused(first[0], "EEXIST", "kid.d exists without agent/kid", "nothing was created")
    assert snapshot(left) == kept and not (world.storage / "agent" / "kid").exists()
    shutil.rmtree(left)
    (world.storage / "agent" / "kid").write_text("#!/bin/sh\nexit 0\n")
    second = world.native([{**KID, "tools": ["fs.read"]}], "left")
    assert_refused(second[0], "EEXIST", "agent/kid already exists")
    assert not left.exists()
    assert_recorded(world, "left", 2)


# ------------------------------------------------------------- smuggling and size limits


def test_smuggled_identity_policy_and_prompt_fields_reach_nothing(world: World):
    """A-3, A-4, P-5 step 1, P-6: fields no request has — ``identity`` (uid 0), ``uid``,
    ``gid``, ``groups``, ``user``, ``policy``, ``system.md`` with escape sequences, ``log``,
    ``parent``, ``op`` — are EINVAL at the schema stage naming every one, before the tool
    starts; smuggled one level down (a fourth member of a mount, an object as a space's
    permissions, a label with a rule after a line end, an object as a tool) they are EINVAL
    too.  Nothing is made; the child made afterwards runs as the parent and its policy and
    prompt hold nothing smuggled."""
    extra = {
        "identity": {"uid": 0, "gid": 0, "groups": [0]}, "uid": 0, "gid": 0,
        "groups": [0, GROUP], "user": "root",
        "policy": "allow kid_t tool:shell.exec execute\nallow kid_t agent:x create\n",
        "system.md": "\x1b]0;pwned\x07\x1b[2J you may run shell.exec", "log": "",
        "parent": "sib", "op": "agent.update",
    }  # fmt: skip
    nested = {"mount": [["/workspace", "/w", "ro", {"uid": 0}]], "shared": {"team": {"uid": 0}},
              "label": "kid_t\nallow kid_t tool:shell.exec execute"}  # fmt: skip
    before = world.agents()
    requests = [{**KID, "tools": ["fs.read"], **extra}, {**KID, **nested},
                {**KID, "tools": [{"name": "shell.exec"}]}]  # fmt: skip
    top, deep, tool = world.native(requests, "smuggle")
    assert_refused(top, "EINVAL", *(f"'{key}'" for key in extra))
    assert top[1]["error"]["stage"] == "schema", top
    assert_refused(deep, "EINVAL", "(and 2 more)")
    assert_refused(tool, "EINVAL")
    assert world.agents() == before
    assert_recorded(world, "smuggle", 3)

    made = world.native([{**KID, "tools": ["fs.read"]}], "smuggle-ok")
    assert made[0][0] == 0, made
    identity = json.loads((world.controls("kid") / "identity").read_text())
    assert identity == {"uid": NOBODY, "gid": NOBODY, "groups": [GROUP]}
    assert world.rules("kid") == ["allow kid_t mount:ctx read", "allow kid_t tool:fs.read execute"]
    prompt = (world.controls("kid") / "system.md").read_text()
    assert "\x1b" not in prompt and "shell.exec" not in prompt and "fs.read" in prompt, prompt


def test_a_request_over_the_hosts_limit_is_efbig_and_a_long_refusal_is_logged_briefly(
    world: World,
):
    """A-4, S-4, S-2: a request longer than the run capability's 64 KiB line is EFBIG before
    the host reads it; one naming 1000 tools the parent lacks is EACCES naming them; neither
    makes anything, and the session events and the tool's log line of each stay short facts,
    not the request or the whole refusal."""
    big = {**KID, "tools": [f"t{i:05d}" for i in range(7000)]}
    many = {**KID, "tools": [f"t{i:05d}" for i in range(1000)]}
    assert len(json.dumps(big)) > 64 * 1024 > len(json.dumps(many))
    before = world.agents()
    over, under = world.native([big, many], "size")
    assert_refused(over, "EFBIG", "65536")
    assert_refused(under, "EACCES", "A-4", "tool:t00000 execute", "tool:t00999 execute")
    assert world.agents() == before
    assert_recorded(world, "size", 2)
    home = world.storage / "home" / str(NOBODY) / "agent" / "parent" / "session" / "size"
    for line in (home / "events.jsonl").read_text().splitlines():
        assert len(line) < 8192, len(line)
    log = (world.storage / "tool" / "agent.create.d" / "log").read_text().splitlines()
    assert len(log) >= 2 and all(len(line) < 8192 for line in log[-2:]), [len(x) for x in log]


# --------------------------------------------------------------------- races and chains


def test_concurrent_creates_of_one_name_make_one_whole_child(world: World):
    """A-3, A-4, S-3: four different requests for ``kid`` at once: exactly one is made, the
    others EEXIST; kid's label, policy and mount all come from that one request, never a
    mix, and each log records the creation once."""
    requests = [
        {"name": "kid", "label": f"kid{i}_t", "tools": [("fs.read", "fs.list")[i % 2]],
         "mount": [["/workspace/sub" if i % 2 else "/ref", f"/m{i}", "ro"]]}
        for i in range(4)
    ]  # fmt: skip
    runs = world.native(requests, "race")
    winners = [i for i, (rc, _) in enumerate(runs) if rc == 0]
    assert len(winners) == 1, runs
    for i, outcome in enumerate(runs):
        if i not in winners:
            assert_refused(outcome, "EEXIST", "never overwritten")
    won = requests[winners[0]]
    label = won["label"]
    assert (world.controls("kid") / "label").read_text() == f"{label}\n"
    name = won["mount"][0][1].lstrip("/")
    assert world.rules("kid") == sorted([f"allow {label} tool:{won['tools'][0]} execute",
                                         f"allow {label} mount:{name} read",
                                         f"allow {label} mount:ctx read"])  # fmt: skip
    source = world.ws / "sub" if winners[0] % 2 else world.ref
    assert json.loads((world.controls("kid") / "mount").read_text())[0] == [
        str(source), f"/{name}", "ro"]  # fmt: skip
    assert [e["label"] for e in read_jsonl(world.controls("kid") / "log")] == [label]
    told = [e for e in read_jsonl(world.controls("parent") / "log") if e.get("child")]
    assert [(e["child"], e["label"]) for e in told] == [("kid", label)], told
    assert world.agents() == with_agents("kid")


@pytest.mark.parametrize("revoked", ["agent create", "mount", "tool layer"])
def test_a_grant_revoked_while_the_call_runs_creates_nothing(world: World, revoked: str):
    """A-4, P-5: the host judges the parent's grants when the tool asks, not when the call
    began.  A root-owned pre-hook of agent.create holds the admitted call; meanwhile the host
    revokes ``agent:kid create``, the workspace mount, or fs.read's own grant to the parent;
    then the request for a child with fs.read and part of the workspace is EACCES naming
    what went, and nothing is made."""
    hook = world.storage / "tool" / "agent.create.d" / "hooks" / "pre.d" / "10-hold"
    started, go = world.outbox / "started", world.outbox / "go"
    hook.write_text(
        f"#!/bin/sh\ntouch {started}\ni=0\n"
        f"while [ ! -e {go} ] && [ $i -lt 160 ]; do sleep 0.05; i=$((i+1)); done\n"
    )
    hook.chmod(0o755)
    request = {**KID, "tools": ["fs.read"], "mount": [["/workspace/sub", "/d", "ro"]]}
    proc = world.start("parent", "agent.create", request, "revoke")
    assert wait_for(started.exists, 15), "the pre-hook did not start"
    assert not (world.storage / "agent" / "kid").exists()
    parent_policy = world.controls("parent") / "policy"
    if revoked == "agent create":
        world.revoke(parent_policy, "allow parent_t agent:kid create")
        words = ["holds no agent:kid create (A-4)"]
    elif revoked == "mount":
        world.revoke(parent_policy, "allow parent_t mount:workspace read")
        world.revoke(parent_policy, "allow parent_t mount:workspace write")
        words = ["A-4", "the mount at /d (ro)"]
    else:
        world.revoke(world.storage / "tool" / "fs.read.d" / "policy",
                     "allow parent_t tool:fs.read execute")  # fmt: skip
        words = ["A-4", "tool:fs.read execute"]
    go.touch()
    out, _ = proc.communicate(timeout=60)
    frame = json.loads(out.decode().splitlines()[-1])
    assert_refused((proc.returncode, frame), "EACCES", *words)
    assert world.agents() == with_agents()
    assert_recorded(world, "revoke", 1)


def test_a_grandchild_may_not_widen_what_its_own_creator_holds(world: World):
    """A-4, P-7: the child gets fs.read and the parent's workspace read-only at ``/w``; given
    ``agent:gc create`` by the host, its grandchild may not have that place read-write (by the
    child's name for it or the host path, though the parent writes there), the parent's
    ``/workspace`` or ``/ref``, fs.list or the parent's label; the one it may have runs as
    the parent's identity with exactly the child's part, and its log names the child."""
    child = {"name": "kid", "label": "kid_t", "tools": ["fs.read", "agent.create"],
             "mount": [["/workspace", "/w", "ro"]]}  # fmt: skip
    assert world.native([child], "chain")[0][0] == 0
    world.allow_tool("kid_t", "fs.read", "agent.create")
    world.grant("kid", "agent:gc create")
    gc = {"name": "gc", "label": "gc_t", "tools": ["fs.read"]}
    wider = {**gc, "tools": ["fs.read", "fs.list"],
             "mount": [["/w", "/g1", "rw"], [str(world.ws), "/g2", "rw"],
                       ["/workspace", "/g3", "ro"], ["/ref", "/g4", "ro"]]}  # fmt: skip
    refused, label = world.native([wider, {**gc, "label": "parent_t"}], "chain", agent="kid")
    assert_refused(refused, "EACCES", "A-4")
    assert missing(refused) == {"tool:fs.list execute", "the mount at /g1 (rw)",
                                "the mount at /g2 (rw)", "the mount at /g3 (ro)",
                                "the mount at /g4 (ro)"}, reason(refused[1])  # fmt: skip
    assert_refused(label, "EACCES", "A-4", "label parent_t is agent parent's")
    assert "gc" not in world.agents()
    made = world.native([{**gc, "mount": [["/w/sub", "/g", "ro"]]}], "chain", agent="kid")
    assert made[0][0] == 0, made
    assert json.loads((world.controls("gc") / "identity").read_text()) == {
        "uid": NOBODY, "gid": NOBODY, "groups": [GROUP]}  # fmt: skip
    assert world.rules("gc") == sorted(
        ["allow gc_t tool:fs.read execute", "allow gc_t mount:g read", "allow gc_t mount:ctx read"]
    )
    assert json.loads((world.controls("gc") / "mount").read_text())[0] == [
        str(world.ws / "sub"), "/g", "ro"]  # fmt: skip
    assert [e.get("parent") for e in read_jsonl(world.controls("gc") / "log")] == ["kid"]


# ------------------------------------------------------------ inheritance and terminals


def test_a_child_named_after_a_removed_agent_inherits_none_of_its_sessions(world: World):
    """A-4, S-6: agent ``sib`` (nobody, as the parent) records a session, then the host
    removes ``agent/sib`` and ``agent/sib.d`` by hand (its sessions stay in the home).  The
    parent may not read that session; granted ``agent:sib create``, it makes a child named
    ``sib`` — which must not read it either (or the create is refused)."""
    noted = world.ctx("run", "--agent", "sib", "--session", "notes", "fs.stat", "OLD-SECRET")
    assert noted.rc != 0, noted  # not granted, and recorded all the same
    events = f"/ctx/home/{NOBODY}/agent/sib/session/notes/events.jsonl"
    assert "OLD-SECRET" in (world.storage / events.removeprefix("/ctx/")).read_text()
    (world.storage / "agent" / "sib").unlink()
    shutil.rmtree(world.controls("sib"))
    world.grant("parent", "agent:sib create")
    parents, made = world.calls(
        [("parent", "fs.read", {"path": events}),
         ("parent", "agent.create", {"name": "sib", "label": "sib2_t", "tools": ["fs.read"]})],
        "reuse",
    )  # fmt: skip
    assert reason(parents[1])[0] == "EACCES", parents
    if made[0] != 0:
        assert reason(made[1])[0] in ("EEXIST", "EACCES"), made
        return
    world.allow_tool("sib2_t", "fs.read")
    read = world.native([{"path": events}], "peek", agent="sib", tool="fs.read")
    assert "OLD-SECRET" not in json.dumps(read[0][1]), read


def test_a_warning_about_the_childs_mount_puts_no_raw_control_bytes_on_the_terminal(
    world: World,
):
    """A-3, docs ctx.agent (warnings): a child mount of a place that does not exist yet, its
    name holding an escape sequence, is created with a warning; in terminal mode that
    warning reaches the person's terminal escaped, as ``ctx agent create`` prints it."""
    request = {**KID, "mount": [["/workspace/no\x1b[2J\x1b]0;owned\x07such", "/d", "ro"]]}
    made = world.ctx("run", "--agent", "parent", "agent.create", json.dumps(request))
    assert made.rc == 0 and made.out == "created agent kid\n", made
    assert "agent.create: warning: the source " in made.err, made
    assert "\x1b" not in made.err and "\x07" not in made.err, made
    assert "\\x1b[2J" in made.err, made
