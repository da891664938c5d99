"""Random walks across the commands of agents, policy, shared spaces, tool objects, sessions
and ``ctx run`` (SPEC §1 R-3; §4 S-1, S-2, S-5, S-6; §5 P-1..P-8; §6 T-1, T-4, T-7, T-8,
T-8a; §8 A-3; §9 X-1; docs/tools.md, docs/policy.md, docs/sessions.md), each walk a small
Hypothesis state machine (derandomized, so every run takes the same walks) that keeps a
model of what should hold and checks it after each step:

* ``ctx policy explain`` agrees with whether ``ctx run`` is allowed, and names the step that
  the refused call records;
* ``ctx object list`` agrees with ``ctx object which`` and with the tier a call runs from;
* every ``ctx run`` that opens its session leaves exactly one ``tool_call`` and one
  ``tool_result`` there and one line in the tool's log, and ``ctx session show --json`` and
  ``ctx session list`` count what was called;
* agent and space creation keep ``ctx agent list`` / ``ctx agent show`` in line with the
  requests that were accepted;
* a refused command (an illegal name, an invalid request or manifest, a tier that is not
  there) exits non-zero with an errno word and changes nothing on disk.

Plain tests pin down single points of those walks.  Black-box: the installed ``ctx`` in
subprocesses, agents running as the unprivileged user ``nobody`` on a bootstrapped copy of a
storage root."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.acceptance.ctxcli import (
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    is_object_name,
    new_scratch_dir,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root

TOP = scratch_top(__file__)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)

WALK = settings(
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # no shrinking: reproducible as is
    max_examples=6,
    stateful_step_count=10,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def nobody() -> tuple[int, int]:
    """The uid and gid root's agents run as (``ctx agent create --help``)."""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:  # no such user: agent creation is refused, and the tests say so
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid


NOBODY_UID, NOBODY_GID = nobody()
TORN = b'{"ts":"2026-01-01T00:00:00Z","type":"tool_c'


# ----------------------------------------------------------------------------------- world


def whole_lines(path: Path) -> list[dict]:
    """The events of a JSON-lines file, a torn last line (no newline) left out."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def result_frame(run: Run) -> dict:
    """The last JSONL frame of a native ``ctx run``: its ``result``."""
    frames = [json.loads(line) for line in run.out.splitlines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", run
    return frames[-1]


@dataclass(repr=False)
class Root(OnStorage):
    """A bootstrapped storage root in a directory every uid may search."""

    top: Path
    storage: Path

    # -- paths

    def tier_dir(self, tier: str) -> Path:
        if tier == "system":
            return self.storage / "tool"
        if tier == "user":
            return self.storage / "home" / str(os.geteuid()) / "tool"
        return self.storage / "shared" / tier.removeprefix("shared:") / "tool"

    def tool_object(self, tier: str, name: str) -> str:
        """The ``object`` of a call's events (docs/sessions.md, S-2): the tool's place."""
        return str((self.tier_dir(tier) / name).relative_to(self.storage))

    def session_dir(self, agent: str, session: str, project: str | None = None) -> Path:
        base = (
            self.storage / "shared" / project
            if project
            else self.storage / "home" / str(NOBODY_UID)
        )
        return base / "agent" / agent / "session" / session

    def events(self, agent: str, session: str, project: str | None = None) -> list[dict]:
        return whole_lines(self.session_dir(agent, session, project) / "events.jsonl")

    def log(self, name: str, tier: str = "system") -> list[dict]:
        return whole_lines(self.tier_dir(tier) / f"{name}.d" / "log")

    # -- host actions

    def agent(self, name: str, tools=(), shared=None) -> dict:
        request: dict = {"name": name, "label": f"{name}_t", "tools": list(tools)}
        if shared is not None:
            request["shared"] = shared
        return self.create_agent(request)

    def space(self, name: str, group: int | None = NOBODY_GID) -> None:
        args = ["--group", str(group)] if group is not None else []
        made = self.ctx("shared", "create", name, *args)
        assert made.rc == 0, made

    def install(self, name: str, program: str, tier: str = "system") -> Run:
        manifest = tool_manifest(self.top / "manifests" / tier.replace(":", "_"), name, program)
        made = self.ctx("object", "install", manifest, "--tier", tier)
        assert made.rc == 0, made
        return made

    def grant_tool(self, name: str, label: str, tier: str = "system") -> None:
        """The tool layer of P-6 in the tool of ``tier``."""
        with (self.tier_dir(tier) / f"{name}.d" / "policy").open("a") as policy:
            policy.write(f"allow {label} tool:{name} execute\n")

    def explain(self, agent: str, tool: str) -> tuple[Run, dict]:
        explained = self.ctx("policy", "explain", agent, f"tool:{tool}", "execute", "--json")
        assert explained.rc in (0, 1), explained
        return explained, explained.json()

    def run(self, agent: str, tool: str, *args: str, session: str = "default",
            project: str | None = None, native: bool = False,
            timeout: str | None = None) -> Run:  # fmt: skip
        options = ["--agent", agent, "--session", session]
        if timeout:
            options += ["--timeout", timeout]
        if project:
            options += ["--project", project]
        if native:
            return self.ctx("run", *options, "--native", tool, input="{}")
        return self.ctx("run", *options, tool, *args)

    def shown(self, agent: str, session: str, project: str | None = None) -> list[dict]:
        """``ctx session show --json``: the events, one JSON object a line."""
        args = ["--project", project] if project else []
        show = self.ctx("session", "show", agent, "--session", session, *args, "--json")
        assert show.rc == 0, show
        return [json.loads(line) for line in show.lines()]

    def sessions(self, agent: str, project: str | None = None) -> set[str]:
        args = ["--project", project] if project else []
        listed = self.ctx("session", "list", agent, *args, "--json")
        assert listed.rc == 0, listed
        return {entry["name"] for entry in listed.json()}


def rewrite(path: Path, text: str) -> None:
    """``path`` replaced as an administrator's editor saves it, keeping the mode (0644,
    root's: a host-owned control)."""
    temp = path.with_name(path.name + ".new")
    temp.write_text(text)
    os.chmod(temp, path.stat().st_mode & 0o7777)
    os.rename(temp, path)


def one_call_recorded(
    before: list[dict], after: list[dict], log_before: list[dict], log_after: list[dict] | None
) -> tuple[dict, dict]:
    """The two events one call added to its session (S-2, T-7): a ``tool_call`` then its
    ``tool_result`` with the same call id; and, unless ``log_after`` is None (no log), one
    line with that id in the tool's log."""
    assert after[: len(before)] == before, "earlier events changed"
    new = after[len(before) :]
    assert [e["type"] for e in new] == ["tool_call", "tool_result"], new
    call, result = new
    assert call["call"] == result["call"] and call["object"] == result["object"], new
    if log_after is not None:
        assert log_after[: len(log_before)] == log_before, "earlier log lines changed"
        added = log_after[len(log_before) :]
        assert [line["call"] for line in added] == [call["call"]], added
    return call, result


@pytest.fixture
def roots(_template: Path) -> Iterator[Callable[[], Root]]:
    """Make fresh copies of the bootstrapped root, each in its own scratch directory; all
    removed at the end."""
    made: list[Path] = []

    def fresh() -> Root:
        top = new_scratch_dir(TOP, "root-")
        made.append(top)
        return Root(top, copy_of_root(_template, top / "storage"))

    yield fresh
    for top in made:
        shutil.rmtree(top, ignore_errors=True)


class Stage:
    """One storage root prepared once through the CLI (agents, spaces, tools), kept aside
    with ``cp -a`` (owners, groups and modes as they are), and put back at the same path
    before each walk: an agent's mount control names the root's path."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.kept = root.top / "kept"

    def keep(self) -> None:
        subprocess.run(["cp", "-a", str(self.root.storage), str(self.kept)], check=True)

    def reset(self) -> Root:
        shutil.rmtree(self.root.storage)
        subprocess.run(["cp", "-a", str(self.kept), str(self.root.storage)], check=True)
        return self.root


def walk(machine: type[RuleBasedStateMachine], **overrides) -> None:
    run_state_machine_as_test(machine, settings=settings(WALK, **overrides))


# ---------------------------------------------------------------- walk 1: grants and calls

AGENTS = ("ana", "bo.2")
TOOLS = {"echo.t": 0, "Fail-2": 3}  # name -> exit status when it runs
# What the status control says -> the status ``ctx object list`` shows (docs/tools.md).
STATUSES = {
    "available": "available",
    "disabled": "disabled",
    "unavailable: maintenance": "unavailable",
    "Available": "unavailable",
}


CALL_ARGS = {
    "agent": st.sampled_from(AGENTS),
    "tool": st.sampled_from(list(TOOLS)),
    "session": st.sampled_from(["default", "s-1", "Z.z"]),
    "native": st.booleans(),
}


def echo_program(name: str, status: int) -> str:
    return f'#!/bin/sh\necho "{name} ran $*"\nexit {status}\n'


def test_walk_grants_explain_and_calls_agree(roots) -> None:
    """P-5, P-6, P-8, T-7, S-2: grants added and taken in either layer, a tool's status,
    its mode bits, the agent's ``mount:ctx read`` and an invalid agent policy changed in
    any order; at every call ``ctx policy explain`` says allowed exactly when the call runs
    (status aside, which is not a chain step), names the step the refusal records, and the
    call is recorded once in its session and once in the tool's log."""

    stage = Stage(roots())
    for name, code in TOOLS.items():
        stage.root.install(name, echo_program(name, code))
    for agent in AGENTS:
        stage.root.agent(agent)
    stage.keep()

    class Grants(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = stage.reset()
            self.agent_rules: set[tuple[str, str]] = set()
            self.tool_rules: set[tuple[str, str]] = set()
            self.disabled: set[str] = set()
            self.closed: set[str] = set()  # executables made 0750 root:root
            self.no_mount: set[str] = set()
            self.broken: set[str] = set()
            self.vetoed: set[str] = set()
            self.bad_label: set[str] = set()
            self.calls: dict[tuple[str, str], int] = {}
            self.logged = dict.fromkeys(TOOLS, 0)

        # -- the model

        def denying_step(self, agent: str, tool: str) -> int | None:
            if tool in self.closed:
                return 2
            if agent in self.bad_label:
                return 4
            if agent in self.broken or agent in self.no_mount:
                return 5
            if (agent, tool) not in self.agent_rules:
                return 5
            if (agent, tool) not in self.tool_rules:
                return 6
            return None

        def write_agent_policy(self, agent: str) -> None:
            lines = ["# edited by the administrator"]
            if agent not in self.no_mount:
                lines.append(f"allow {agent}_t mount:ctx read")
            granted = sorted(t for a, t in self.agent_rules if a == agent)
            lines += [f"allow {agent}_t tool:{t} execute" for t in granted]
            if agent in self.broken:
                lines.append(f"allow {agent}_t tool:* execute")
            path = self.root.storage / "agent" / f"{agent}.d" / "policy"
            rewrite(path, "\n".join(lines) + "\n")

        def write_tool_policy(self, tool: str) -> None:
            lines = ["# the tool's own layer"]
            lines += [f"allow {a}_t tool:{tool} execute" for a, t in self.tool_rules if t == tool]
            rewrite(self.root.storage / "tool" / f"{tool}.d" / "policy", "\n".join(lines) + "\n")

        def query(self, agent: str, tool: str) -> None:
            """``ctx policy query`` over the two layers agrees with the rules written."""
            asked = self.root.ctx(
                "policy", "query",
                "--policy", self.root.storage / "agent" / f"{agent}.d" / "policy",
                "--policy", self.root.storage / "tool" / f"{tool}.d" / "policy",
                f"{agent}_t", f"tool:{tool}", "execute",
            )  # fmt: skip
            if agent in self.broken:
                assert asked.rc == 2 and "EINVAL" in asked.err, asked
                return
            both = (agent, tool) in self.agent_rules and (agent, tool) in self.tool_rules
            assert (asked.rc, asked.out.strip()) == ((0, "allow") if both else (1, "deny")), asked

        # -- host edits

        @rule(agent=st.sampled_from(AGENTS), tool=st.sampled_from(list(TOOLS)), on=st.booleans())
        def agent_layer(self, agent: str, tool: str, on: bool) -> None:
            (self.agent_rules.add if on else self.agent_rules.discard)((agent, tool))
            self.write_agent_policy(agent)
            self.query(agent, tool)

        @rule(agent=st.sampled_from(AGENTS), tool=st.sampled_from(list(TOOLS)), on=st.booleans())
        def tool_layer(self, agent: str, tool: str, on: bool) -> None:
            (self.tool_rules.add if on else self.tool_rules.discard)((agent, tool))
            self.write_tool_policy(tool)
            self.query(agent, tool)

        @rule(tool=st.sampled_from(list(TOOLS)), status=st.sampled_from(sorted(STATUSES)))
        def status(self, tool: str, status: str) -> None:
            """T-1: the status column of ``ctx object list`` is what a call would meet."""
            (self.disabled.discard if status == "available" else self.disabled.add)(tool)
            rewrite(self.root.storage / "tool" / f"{tool}.d" / "status", status + "\n")
            listed = self.root.ctx("object", "list", "--tier", "system", "--json")
            entry = next(e for e in listed.json() if e["name"] == tool)
            assert entry["status"] == STATUSES[status], (entry, status)

        @rule(tool=st.sampled_from(list(TOOLS)), closed=st.booleans())
        def mode(self, tool: str, closed: bool) -> None:
            (self.closed.add if closed else self.closed.discard)(tool)
            os.chmod(self.root.storage / "tool" / tool, 0o750 if closed else 0o755)

        @rule(tool=st.sampled_from(list(TOOLS)))
        def reinstall(self, tool: str) -> None:
            """T-8: a reinstall keeps policy, status, log and hooks; its executable is new."""
            kept = {
                control: (self.root.storage / "tool" / f"{tool}.d" / control).read_bytes()
                for control in ("policy", "status", "log")
            }
            again = self.root.install(tool, echo_program(tool, TOOLS[tool]))
            assert again.out.startswith(f"replaced {tool} in tier system: "), again
            for control, data in kept.items():
                path = self.root.storage / "tool" / f"{tool}.d" / control
                assert path.read_bytes() == data, control
            assert (self.root.storage / "tool" / tool).stat().st_mode & 0o777 == 0o755
            self.closed.discard(tool)

        @rule(tool=st.sampled_from(list(TOOLS)), veto=st.booleans())
        def pre_hook(self, tool: str, veto: bool) -> None:
            """T-6: a pre-hook that exits non-zero vetoes; without its execute bits it is
            no hook."""
            hook = self.root.storage / "tool" / f"{tool}.d" / "hooks" / "pre.d" / "10-veto"
            hook.write_text("#!/bin/sh\necho vetoed by the walk >&2\nexit 1\n")
            hook.chmod(0o755 if veto else 0o644)
            (self.vetoed.add if veto else self.vetoed.discard)(tool)

        @rule(agent=st.sampled_from(AGENTS), granted=st.booleans(), broken=st.booleans())
        def agent_policy_shape(self, agent: str, granted: bool, broken: bool) -> None:
            (self.no_mount.discard if granted else self.no_mount.add)(agent)
            (self.broken.add if broken else self.broken.discard)(agent)
            self.write_agent_policy(agent)
            checked = self.root.ctx(
                "policy", "check", self.root.storage / "agent" / f"{agent}.d" / "policy"
            )
            assert checked.rc == (1 if broken else 0), checked
            if broken:
                assert ": EINVAL: " in checked.err, checked
            self.problems()

        @rule(agent=st.sampled_from(AGENTS), valid=st.booleans())
        def label(self, agent: str, valid: bool) -> None:
            """Step 4: a label that is no subject type grants nothing."""
            (self.bad_label.discard if valid else self.bad_label.add)(agent)
            text = f"{agent}_t\n" if valid else f"{agent} t\n"
            rewrite(self.root.storage / "agent" / f"{agent}.d" / "label", text)
            self.problems()

        def problems(self) -> None:
            """``ctx agent list`` lists a problem for each agent whose label or policy is
            unusable (docs/tools.md, A-3), and for no other."""
            listed = self.root.ctx("agent", "list", "--json")
            troubled = {a["name"] for a in listed.json() if a["problems"]}
            assert troubled == self.broken | self.bad_label, listed

        # -- calls

        @rule(**CALL_ARGS)
        def call_one(self, agent: str, tool: str, session: str, native: bool) -> None:
            self.call(agent, tool, session, native)

        @rule(**CALL_ARGS)
        def call_another(self, agent: str, tool: str, session: str, native: bool) -> None:
            self.call(agent, tool, session, native)

        def call(self, agent: str, tool: str, session: str, native: bool) -> None:
            root = self.root
            step = self.denying_step(agent, tool)
            explained, why = root.explain(agent, tool)
            assert why["allowed"] is (step is None) and why["step"] == step, (explained, step)
            assert explained.rc == (0 if step is None else 1), explained
            before, log_before = root.events(agent, session), root.log(tool)
            ran = root.run(agent, tool, "a b", session=session, native=native)
            call, result = one_call_recorded(
                before, root.events(agent, session), log_before, root.log(tool)
            )
            self.calls[agent, session] = self.calls.get((agent, session), 0) + 1
            self.logged[tool] += 1
            assert call["object"] == f"tool/{tool}" and call["mode"] == (
                "native" if native else "terminal"
            ), call
            if tool in self.disabled:
                expected_rc, stage, errno = 126, "resolve", "EACCES"
            elif step is not None:
                expected_rc, stage, errno = 126, "authorize", "EACCES"
            elif tool in self.vetoed:
                expected_rc, stage, errno = 126, "hook", "EACCES"
            else:
                expected_rc, stage, errno = TOOLS[tool], ("exit" if TOOLS[tool] else None), None
            if native:
                frame = result_frame(ran)
                assert ran.rc == (0 if expected_rc == 0 else 1), ran
                assert (frame["error"] or {}).get("stage") == stage, frame
                assert frame["call"] == call["call"], (frame, call)
            else:
                assert ran.rc == expected_rc, ran
                if expected_rc == 126:
                    assert ran.err.startswith(f"ctx: {errno}: ") and ran.out == "", ran
                    assert stage != "hook" or "10-veto" in ran.err, ran
                else:
                    assert ran.out == f"{tool} ran a b\n", ran
            assert result["status"] == ("ok" if expected_rc == 0 else "error"), result
            assert result.get("stage") == stage and result.get("errno") == errno, result
            if stage == "authorize":
                assert result["step"] == step and f"step {step} " in result["message"], result
            shown = root.shown(agent, session)
            assert len(shown) == 2 * self.calls[agent, session], shown

        def teardown(self) -> None:
            root = self.root
            for agent in AGENTS:
                used = {s for (a, s), n in self.calls.items() if a == agent and n}
                assert root.sessions(agent) == used, agent
            for tool, n in self.logged.items():
                assert len(root.log(tool)) == n, tool

    walk(Grants)


# ------------------------------------------------------------ walk 2: tiers and resolution

NAMES = ("lsx", "Y-1.v")
CORE = ("tsh.config", "system")  # a core tool: its system copy belongs to bootstrap
# A human's search path (T-4: $CTX_PATH) over the four tiers, p1 before p.2 ...
HUMAN_TIERS = ("system", "user", "shared:p1", "shared:p.2")
HUMAN_PATH = f"/ctx/tool:/ctx/home/{os.geteuid()}/tool:/ctx/shared/p1/tool:/ctx/shared/p.2/tool"
# ... and an agent's, derived by the runtime: its spaces in name order ('.' before '1').
AGENT_TIERS = ("system", "shared:p.2", "shared:p1")


def tier_program(name: str, tier: str, version: int) -> str:
    return f'#!/bin/sh\necho "{name}@{tier} v{version}"\n'


BAD_INSTALLS = {
    # kind: (manifest name, program or None for a manifest without description, tier, rc, errno)
    "core name in the system tier": ("fs.read", "ok", "system", 1, "EEXIST"),
    "manifest without description": ("nodesc", None, "system", 1, "EINVAL"),
    "space never made": ("lsx", "ok", "shared:nospace", 1, "ENOENT"),
    "illegal space name": ("lsx", "ok", "shared:.x", 2, "EINVAL"),
    "unknown tier": ("lsx", "ok", "bogus", 2, "EINVAL"),
    "the manual bundle": ("lsx", "ok", "shared:cortexfs-docs", 2, "EINVAL"),
}


def bad_manifest(root: Root, kind: str) -> tuple[Path, str, int, str]:
    name, program, tier, rc, errno = BAD_INSTALLS[kind]
    where = root.top / "bad-manifests" / kind.replace(" ", "-")
    manifest = tool_manifest(where, name, f"#!/bin/sh\necho {program}\n")
    if program is None:
        document = json.loads(manifest.read_text())
        del document["description"]
        manifest.write_text(json.dumps(document))
    return manifest, tier, rc, errno


def test_walk_tiers_list_which_and_calls_agree(roots) -> None:
    """T-4, T-8, T-8a, H-3: tools of two names (and a namesake of the core tool
    ``tsh.config``) installed and reinstalled into the system, user and two shared tiers,
    their executables' modes changed (no execute bit, or one for root alone), refused
    installs in between; after each step ``ctx object list`` shows each installed copy with
    its status, ``ctx object which`` (a human's ``$CTX_PATH``) names the first executable one
    along that path, listed as available, and ``ctx tool`` runs the core CLI only when that
    is the core tool; a call of the agent meets the first executable one along the agent's
    path and runs it or is refused at step 2, as ``ctx policy explain`` says; a reinstall
    keeps the tool's policy; a refused install changes nothing."""
    stage = Stage(roots())
    root = stage.root
    root.space("p1")
    root.space("p.2")
    root.agent("walker", tools=NAMES, shared={"p1": "read", "p.2": "read"})
    shown = root.ctx("agent", "show", "walker", "--json")
    path = "/ctx/tool:/ctx/home/{}/tool:/ctx/shared/p.2/tool:/ctx/shared/p1/tool"
    assert shown.json()["ctx_path"] == path.format(NOBODY_UID), shown
    stage.keep()

    class Tiers(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = stage.reset()
            self.version: dict[tuple[str, str], int] = {CORE: 0}
            self.mode: dict[tuple[str, str], int] = {CORE: 0o755}
            self.human = clean_env(CTX_STORAGE=str(self.root.storage), CTX_PATH=HUMAN_PATH)
            self.serial = 0

        def first(self, name: str, tiers: tuple[str, ...]) -> str | None:
            """T-4: the first tier holding a file of ``name`` with an execute bit at all."""
            return next((t for t in tiers if self.mode.get((name, t), 0) & 0o111), None)

        def check_name(self, name: str) -> None:
            root = self.root
            listed = root.ctx("object", "list", "--json")
            assert listed.rc == 0, listed
            copies = {e["tier"]: e for e in listed.json() if e["name"] == name}
            assert set(copies) == {t for n, t in self.version if n == name}, copies
            for tier, entry in copies.items():
                assert entry["path"] == str(root.tier_dir(tier) / name), entry
                want = "available" if self.mode[name, tier] & 0o111 else "damaged"
                assert entry["status"] == want, entry
            which = root.ctx("object", "which", name, "--json", env=self.human)
            tier = self.first(name, HUMAN_TIERS)
            if tier is None:
                assert which.rc == 1 and "ENOENT" in which.err, which
                return
            assert which.rc == 0 and which.json()["path"] == str(root.tier_dir(tier) / name)
            assert copies[tier]["status"] == "available", (which, copies)
            if name == CORE[0]:
                # H-3: ctx tool runs it only while CTX_PATH resolves it to the core tool.
                used = root.ctx("tool", name, env=self.human)
                if tier == "system":
                    assert used.rc == 0 and "cache_capacity=" in used.out, used
                else:
                    assert used.rc == 1 and used.err.startswith("ctx: EACCES: "), used

        @rule()
        def core_cli(self) -> None:
            """H-3: ``ctx tool tsh.config`` while nothing resolves it is ENOENT."""
            if self.first(CORE[0], HUMAN_TIERS) is None:
                used = self.root.ctx("tool", CORE[0], env=self.human)
                assert used.rc == 1 and used.err.startswith("ctx: ENOENT: "), used
            else:
                self.check_name(CORE[0])

        @rule(name=st.sampled_from((*NAMES, CORE[0])), tier=st.sampled_from(HUMAN_TIERS))
        def install(self, name: str, tier: str) -> None:
            if (name, tier) == CORE:
                self.refused_install("core name in the system tier")
                return
            self.serial += 1
            first = (name, tier) not in self.version
            made = self.root.install(name, tier_program(name, tier, self.serial), tier)
            assert made.out.startswith("installed " if first else "replaced "), made
            self.version[name, tier] = self.serial
            self.mode[name, tier] = 0o755
            policy = self.root.tier_dir(tier) / f"{name}.d" / "policy"
            if first:
                self.root.grant_tool(name, "walker_t", tier)
            else:
                assert f"allow walker_t tool:{name} execute" in policy.read_text(), made
            self.check_name(name)

        @precondition(lambda self: self.version)
        @rule(data=st.data(), mode=st.sampled_from([0o755, 0o644, 0o700]))
        def execute_bits(self, data, mode: int) -> None:
            """0644: no hit, the search goes on; 0700: a hit, which the agent (``nobody``)
            may not execute: step 2 refuses it, no later copy stands in for it."""
            name, tier = data.draw(st.sampled_from(sorted(self.version)))
            os.chmod(self.root.tier_dir(tier) / name, mode)
            self.mode[name, tier] = mode
            self.check_name(name)

        @rule(kind=st.sampled_from(sorted(BAD_INSTALLS)))
        def refused_install(self, kind: str) -> None:
            manifest, tier, rc, errno = bad_manifest(self.root, kind)
            before = snapshot(self.root.storage)
            refused = self.root.ctx("object", "install", manifest, "--tier", tier)
            assert refused.rc == rc and refused.err.startswith(f"ctx: {errno}: "), refused
            assert snapshot(self.root.storage) == before, kind

        @rule(name=st.sampled_from(NAMES))
        def call(self, name: str) -> None:
            root = self.root
            tier = self.first(name, AGENT_TIERS)
            explained, why = root.explain("walker", name)
            before = root.events("walker", "default")
            ran = root.run("walker", name)
            call, result = one_call_recorded(before, root.events("walker", "default"), [], None)
            if tier is None:
                assert why["allowed"] is False and why["errno"] == "ENOENT", explained
                assert ran.rc == 127 and ran.err.startswith("ctx: ENOENT: "), ran
                assert result["stage"] == "resolve", result
                return
            assert call["object"] == root.tool_object(tier, name), call
            if not self.mode[name, tier] & 0o001:
                assert (why["allowed"], why["step"]) == (False, 2), explained
                assert ran.rc == 126 and ran.err.startswith("ctx: EACCES: step 2 "), ran
                assert (result["stage"], result["step"]) == ("authorize", 2), result
                return
            assert why["allowed"] is True, explained
            assert ran.rc == 0, ran
            assert ran.out == f"{name}@{tier} v{self.version[name, tier]}\n", ran
            assert call["object"] == root.tool_object(tier, name), call
            assert root.log(name, tier)[-1]["call"] == call["call"]

    walk(Tiers)


# ------------------------------------------------------------------- walk 3: sessions

SESSIONS = ("default", "s.1", "x" * 63 + "9")
PLACES = (None, "team", "closed")  # the home; a space the agent writes; one it only reads
# terminal exit status of a call of each tool; "slow" runs past its --timeout (SIGKILL: 137)
CALLED = {"ok.t": 0, "bad.t": 5, "nogrant": 126, "missing": 127, "slow": 137}
TIMEOUT = "0.4"
OUTCOMES = {  # the stage and errno its tool_result records
    "ok.t": (None, None),
    "bad.t": ("exit", None),
    "nogrant": ("authorize", "EACCES"),
    "missing": ("resolve", "ENOENT"),
    "slow": ("run", "ETIMEDOUT"),
}
ILLEGAL_RUNS = {
    "session": ["--session", ".s"],
    "project": ["--project", "a/b"],
    "agent name": [],
    "tool name": [],
}


def test_walk_sessions_count_every_call(roots) -> None:
    """S-1, S-2, S-5, S-6, T-7: calls into the agent's home sessions and a space's, of a tool
    that succeeds, one that fails, one refused by the chain and one that is not there, in
    terminal and native mode; torn last lines left by a crash; repairs; refused command
    lines; ``ctx session show --json`` and ``ctx session list`` count exactly the calls made,
    a call recorded in a space it may only read is refused with nothing created, and a
    refused command line changes nothing on disk."""
    stage = Stage(roots())
    root = stage.root
    root.space("team")
    root.space("closed")
    root.agent("scribe", tools=CALLED, shared={"team": "read write", "closed": "read"})
    root.install("ok.t", "#!/bin/sh\necho '{\"ok\": true}'\n")
    root.install("bad.t", "#!/bin/sh\necho failing >&2\nexit 5\n")
    root.install("nogrant", "#!/bin/sh\necho never\n")
    root.install("slow", "#!/bin/sh\necho begun\nexec sleep 30\n")
    for tool in ("ok.t", "bad.t", "slow"):
        root.grant_tool(tool, "scribe_t")
    stage.keep()

    class Sessions(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = stage.reset()
            self.calls: dict[tuple[str | None, str], int] = {}
            self.torn: dict[tuple[str | None, str], int] = {}  # bytes of a torn last line
            self.logged = dict.fromkeys(CALLED, 0)

        def count(self, place: str | None, session: str) -> None:
            shown = self.root.shown("scribe", session, place)
            assert len(shown) == 2 * self.calls[place, session], shown
            assert all(e["session"] == session for e in shown), shown

        def events_file(self, place: str | None, session: str) -> Path:
            return self.root.session_dir("scribe", session, place) / "events.jsonl"

        @rule(
            place=st.sampled_from(PLACES),
            session=st.sampled_from(SESSIONS),
            tool=st.sampled_from(list(CALLED)),
            native=st.booleans(),
        )
        def call(self, place: str | None, session: str, tool: str, native: bool) -> None:
            root = self.root
            before = root.events("scribe", session, place)
            log_before = root.log(tool) if tool != "missing" else []
            step = None
            if place is not None:
                # S-6: the session's space needs shared:P write through the whole chain.
                why = root.ctx("policy", "explain", "scribe", f"shared:{place}", "write", "--json")
                assert why.json()["allowed"] is (place == "team"), why
                step = why.json()["step"]
            timeout = TIMEOUT if tool == "slow" else None
            ran = root.run(
                "scribe", tool, session=session, project=place, native=native, timeout=timeout
            )
            if place == "closed":
                assert ran.rc == (1 if native else 126), ran
                if native:
                    error = result_frame(ran)["error"]
                    assert (error["error"], error["stage"], error["step"]) == (
                        "EACCES",
                        "session",
                        step,
                    ), ran
                else:
                    assert ran.err.startswith(f"ctx: EACCES: step {step} "), ran
                assert not (root.storage / "shared" / "closed" / "agent" / "scribe").exists()
                if tool != "missing":
                    assert root.log(tool) == log_before
                return
            has_log = tool != "missing"
            _, result = one_call_recorded(
                before,
                root.events("scribe", session, place),
                log_before,
                root.log(tool) if has_log else None,
            )
            assert (result.get("stage"), result.get("errno")) == OUTCOMES[tool], result
            self.calls[place, session] = self.calls.get((place, session), 0) + 1
            self.logged[tool] += 1
            expected = CALLED[tool]
            assert ran.rc == ((0 if expected == 0 else 1) if native else expected), ran
            raw = self.events_file(place, session).read_bytes()
            assert raw.endswith(b"\n") and raw.count(b"\n") == 2 * self.calls[place, session]
            self.torn.pop((place, session), None)
            self.count(place, session)

        @precondition(lambda self: self.calls)
        @rule(data=st.data(), last=st.integers(0, 5))
        def read_back(self, data, last: int) -> None:
            """The text timeline has one line per event; ``tail -n N`` prints the last N
            events ``show --json`` prints; ``session list`` text and JSON name the same."""
            place, session = data.draw(st.sampled_from(sorted(self.calls, key=str)))
            args = ["--session", session] + (["--project", place] if place else [])
            shown = self.root.shown("scribe", session, place)
            text = self.root.ctx("session", "show", "scribe", *args)
            assert text.rc == 0 and len(text.lines()) == len(shown), text
            for line, event in zip(text.lines(), shown, strict=True):
                assert line.split()[:2] == [event["ts"], event["type"]], (line, event)
            tail = self.root.ctx("session", "tail", "scribe", *args, "-n", str(last), "--json")
            assert tail.rc == 0, tail
            assert [json.loads(line) for line in tail.lines()] == shown[max(0, len(shown) - last) :]
            listed = self.root.ctx("session", "list", "scribe", *args[2:])
            assert listed.rc == 0 and set(listed.lines()) == self.root.sessions("scribe", place)

        @precondition(lambda self: self.calls)
        @rule(data=st.data())
        def crash_mid_append(self, data) -> None:
            place, session = data.draw(st.sampled_from(sorted(self.calls, key=str)))
            with self.events_file(place, session).open("ab") as events:
                events.write(TORN)
            self.torn[place, session] = self.torn.get((place, session), 0) + len(TORN)
            args = ["--project", place] if place else []
            shown = self.root.ctx("session", "show", "scribe", "--session", session, *args)
            assert shown.rc == 0 and "torn" in shown.err, shown
            self.count(place, session)

        @rule(place=st.sampled_from(PLACES[:2]), session=st.sampled_from(SESSIONS))
        def repair(self, place: str | None, session: str) -> None:
            args = ["--project", place] if place else []
            before = snapshot(self.root.storage)
            repaired = self.root.ctx(
                "session", "repair", "scribe", "--session", session, *args, "--json"
            )
            if (place, session) not in self.calls:
                assert repaired.rc == 1 and repaired.err.startswith("ctx: ENOENT: "), repaired
                assert snapshot(self.root.storage) == before
                return
            assert repaired.rc == 0, repaired
            torn = self.torn.pop((place, session), 0)
            assert repaired.json()["truncated_bytes"] == torn, repaired
            raw = self.events_file(place, session).read_bytes()
            assert raw.endswith(b"\n") and raw.count(b"\n") == 2 * self.calls[place, session]

        @rule(kind=st.sampled_from(sorted(ILLEGAL_RUNS)), native=st.booleans())
        def illegal_command_line(self, kind: str, native: bool) -> None:
            agent = ".scribe" if kind == "agent name" else "scribe"
            tool = "ok.t.d" if kind == "tool name" else "ok.t"
            before = snapshot(self.root.storage)
            mode = ["--native"] if native else []
            refused = self.root.ctx(
                "run", "--agent", agent, *ILLEGAL_RUNS[kind], *mode, "--", tool, input="{}"
            )
            assert refused.rc == 2 and "EINVAL" in refused.err, refused
            assert snapshot(self.root.storage) == before, kind

        def teardown(self) -> None:
            root = self.root
            for place in PLACES:
                used = {s for (p, s) in self.calls if p == place}
                assert root.sessions("scribe", place) == used, place
            for (place, session), n in self.calls.items():
                assert len(root.shown("scribe", session, place)) == 2 * n
            for tool, n in self.logged.items():
                assert len(root.log(tool)) == (n if tool != "missing" else 0), tool

    walk(Sessions)


# ------------------------------------------------------------ walk 4: agents and spaces

AGENT_NAMES = ("r1", "Rx.2", ".hidden", "bad.d", "a" * 65)
SPACE_NAMES = ("alpha", "b-2", "gamma", ".x", "cortexfs-docs")
DOCS = "cortexfs-docs"  # the manual bundle: readable, never a space to write (X-2, D-1)
GRANTS = st.dictionaries(
    st.sampled_from((*SPACE_NAMES[:3], DOCS)),
    st.sampled_from(["read", "write", "read write"]),
    max_size=3,
)


def test_walk_agents_and_spaces_stay_as_listed(roots) -> None:
    """A-3, X-1, T-4, P-8, R-3: agents created with grants on spaces that exist or not yet,
    spaces created with the agents' group or with root's, illegal and duplicate names among
    them; ``ctx agent list`` names exactly the agents accepted, ``ctx agent show`` derives
    each one's ``CTX_PATH`` from its read grants (a space not made yet stays on it, one the
    agent's groups may not enter is off it, in name order), ``ctx policy query`` on its policy
    agrees with its request, and every refused creation changes nothing on disk."""
    stage = Stage(roots())
    stage.keep()

    class Agents(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = stage.reset()
            self.agents: dict[str, dict[str, set[str]]] = {}
            self.spaces: dict[str, int] = {}  # name -> group

        def ctx_path(self, agent: str) -> str:
            path = ["/ctx/tool", f"/ctx/home/{NOBODY_UID}/tool"]
            for space in sorted(set(self.agents[agent]) - {DOCS}):
                seen = space not in self.spaces or self.spaces[space] == NOBODY_GID
                if "read" in self.agents[agent][space] and seen:
                    path.append(f"/ctx/shared/{space}/tool")
            return ":".join(path)

        def check_agent(self, agent: str) -> None:
            shown = self.root.ctx("agent", "show", agent, "--json")
            assert shown.rc == 0 and shown.json()["problems"] == [], shown
            assert shown.json()["ctx_path"] == self.ctx_path(agent), (shown, self.spaces)

        @rule(name=st.sampled_from(AGENT_NAMES), grants=GRANTS)
        def create_agent(self, name: str, grants: dict[str, str]) -> None:
            root = self.root
            label = f"{name[:60]}_t"
            request = {"name": name, "label": label, "tools": ["fs.read"], "shared": grants}
            before = snapshot(root.storage)
            made = root.ctx("agent", "create", "-", "--json", input=json.dumps(request))
            if name in self.agents or not is_object_name(name):
                errno = "EEXIST" if name in self.agents else "EINVAL"
                assert made.rc != 0 and errno in made.err, made
                assert snapshot(root.storage) == before, request
            else:
                assert made.rc == 0, made
                self.agents[name] = {s: set(p.split()) for s, p in grants.items()}
                self.check_warnings(made.json()["warnings"], self.agents[name])
                self.check_agent(name)
                policy = root.storage / "agent" / f"{name}.d" / "policy"
                space = min(grants, default="alpha")
                for perm in ("read", "write"):
                    asked = root.ctx(
                        "policy", "query", "--policy", policy, label, f"shared:{space}", perm
                    )
                    granted = perm in self.agents[name].get(space, set())
                    assert asked.rc == (0 if granted else 1), (asked, request)
            listed = root.ctx("agent", "list", "--json")
            assert listed.rc == 0, listed
            assert sorted(a["name"] for a in listed.json()) == sorted(self.agents), listed

        def check_warnings(self, warnings: list[str], grants: dict[str, set[str]]) -> None:
            """docs/tools.md (A-3): a grant on a space not made yet, ``write`` without
            ``read``, and ``write`` to the manual bundle are each warned of, once."""
            expected: dict[str, int] = {}
            for space, perms in grants.items():
                if space == DOCS:
                    expected[space] = int("write" in perms)
                else:
                    expected[space] = (space not in self.spaces) + (perms == {"write"})
            said = {s: sum(w.startswith(f"shared:{s} ") for w in warnings) for s in grants}
            assert said == expected and len(warnings) == sum(expected.values()), warnings

        @rule(name=st.sampled_from(SPACE_NAMES), ours=st.booleans())
        def create_space(self, name: str, ours: bool) -> None:
            root = self.root
            args = ["--group", str(NOBODY_GID)] if ours else []
            before = snapshot(root.storage)
            made = root.ctx("shared", "create", name, *args)
            if not is_object_name(name) or name == "cortexfs-docs":
                assert made.rc == 2 and made.err.startswith("ctx: EINVAL: "), made
                assert snapshot(root.storage) == before, name
                return
            assert made.rc == 0, made
            if ours:
                self.spaces[name] = NOBODY_GID
            else:
                self.spaces.setdefault(name, os.getegid())
            assert (root.storage / "shared" / name).stat().st_gid == self.spaces[name]

        @precondition(lambda self: self.agents)
        @rule(data=st.data())
        def show(self, data) -> None:
            agent = data.draw(st.sampled_from(sorted(self.agents)))
            self.check_agent(agent)
            space = data.draw(st.sampled_from((*SPACE_NAMES[:3], DOCS)))
            explained = self.root.ctx("policy", "explain", agent, f"shared:{space}", "read")
            reaches = self.spaces.get(space) == NOBODY_GID
            # docs/tools.md: every agent may read the manual bundle without a rule.
            granted = space == DOCS or "read" in self.agents[agent].get(space, set())
            reaches = reaches or space == DOCS
            assert explained.rc == (0 if reaches and granted else 1), explained

    walk(Agents)


# ---------------------------------------------------------- walk 5: the policy language

SUBJECTS = ("coder_t", "rev.1_t")
OBJECTS = ("tool:fs.read", "shared:proj-a", "model:openai/gpt-5.6", "network:default")
PERMS = {"tool": "execute", "shared": "write", "model": "use", "network": "connect"}
INVALID = (
    "allow coder_t agent:* create",
    "deny coder_t tool:fs.read execute",
    "allow coder_t tool:fs.read read",
    "allow coder_t tool:fs.read execute # trailing",
    "allow coder_t network:internet connect",
    "allow coder.d tool:fs.read execute",
    "allow coder_t bogus:x read",
)
FILLER = ("", "# a comment", "   # indented comment", "\t")


def test_walk_policy_files_check_and_query_agree(roots) -> None:
    """P-1..P-4, P-7, P-8: two policy files built up and cut down line by line (rules,
    invalid lines, comments and blank lines, duplicates); ``ctx policy check --json`` finds
    exactly the invalid lines, by number; ``ctx policy query`` over both files answers allow
    exactly when both are valid and both hold the rule, deny otherwise, and exit 2 with
    EINVAL while either is invalid."""
    top = roots().top

    class Policies(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.files = [top / "agent.policy", top / "tool.policy"]
            self.lines: list[list[str]] = [[], []]
            self.save()

        def save(self) -> None:
            for path, lines in zip(self.files, self.lines, strict=True):
                path.write_text("".join(line + "\n" for line in lines))

        def invalid(self, which: int) -> list[int]:
            return [n for n, line in enumerate(self.lines[which], 1) if line in INVALID]

        @rule(
            which=st.integers(0, 1),
            subject=st.sampled_from(SUBJECTS),
            obj=st.sampled_from(OBJECTS),
        )
        def add_rule(self, which: int, subject: str, obj: str) -> None:
            self.lines[which].append(f"allow {subject} {obj} {PERMS[obj.split(':')[0]]}")
            self.save()

        @rule(which=st.integers(0, 1), line=st.sampled_from(INVALID + FILLER))
        def add_other(self, which: int, line: str) -> None:
            self.lines[which].append(line)
            self.save()

        @precondition(lambda self: any(self.lines))
        @rule(data=st.data())
        def cut(self, data) -> None:
            which = data.draw(st.sampled_from([i for i in (0, 1) if self.lines[i]]))
            del self.lines[which][data.draw(st.integers(0, len(self.lines[which]) - 1))]
            self.save()

        @rule()
        def check(self) -> None:
            checked = ctx_run("policy", "check", *self.files, "--json")
            bad = [self.invalid(0), self.invalid(1)]
            assert checked.rc == (1 if any(bad) else 0), checked
            report = checked.json()
            assert report["valid"] is not any(bad), report
            for entry, lines in zip(report["files"], bad, strict=True):
                assert [p["line"] for p in entry["problems"]] == lines, (entry, self.lines)
                assert all((p["error"], p["errno"]) == ("EINVAL", 22) for p in entry["problems"])
            said = [line for line in checked.err.splitlines() if ": EINVAL: " in line]
            assert len(said) == sum(map(len, bad)), checked

        @rule(subject=st.sampled_from(SUBJECTS), obj=st.sampled_from(OBJECTS))
        def query(self, subject: str, obj: str) -> None:
            perm = PERMS[obj.split(":")[0]]
            args = [a for path in self.files for a in ("--policy", path)]
            asked = ctx_run("policy", "query", *args, subject, obj, perm)
            if self.invalid(0) or self.invalid(1):
                assert asked.rc == 2 and "EINVAL" in asked.err, asked
                return
            rule_text = f"allow {subject} {obj} {perm}"
            both = all(rule_text in lines for lines in self.lines)
            assert (asked.rc, asked.out) == ((0, "allow\n") if both else (1, "deny\n")), asked

    walk(Policies, max_examples=12, stateful_step_count=15)


# ------------------------------------------------------------------ single points of walks


@pytest.fixture
def root(roots) -> Root:
    return roots()


def granted_echo(root: Root, agent: str = "ana", tool: str = "echo.t") -> None:
    """Tool ``tool`` installed, agent ``agent`` made: both layers of P-6 allow the call."""
    root.install(tool, echo_program(tool, 0))
    root.agent(agent, tools=[tool])
    root.grant_tool(tool, f"{agent}_t")


def drop_rule(path: Path, rule_text: str) -> None:
    lines = path.read_text().splitlines()
    assert rule_text in lines, (path, lines)
    rewrite(path, "".join(line + "\n" for line in lines if line != rule_text))


DENIALS = {
    # what the administrator changes -> the step of P-5 that denies, and its errno
    "executable closed to the agent": (2, "EACCES"),
    "agent layer without the rule": (5, "EACCES"),
    "agent policy without its mount": (5, "EACCES"),
    "agent policy with an invalid line": (5, "EACCES"),
    "tool layer without the rule": (6, "EACCES"),
}


@pytest.mark.parametrize("change", sorted(DENIALS))
def test_explain_names_the_step_each_refused_call_records(root: Root, change: str) -> None:
    """P-5, P-6, P-8, S-2, T-7: ``ctx policy explain`` denies at the step the refused call
    names on stderr (exit 126), in its ``tool_result`` and in the tool's log line; the tool
    does not run."""
    granted_echo(root)
    agent_policy = root.storage / "agent" / "ana.d" / "policy"
    if change == "executable closed to the agent":
        os.chmod(root.storage / "tool" / "echo.t", 0o750)
    elif change == "agent layer without the rule":
        drop_rule(agent_policy, "allow ana_t tool:echo.t execute")
    elif change == "agent policy without its mount":
        drop_rule(agent_policy, "allow ana_t mount:ctx read")
    elif change == "agent policy with an invalid line":
        with agent_policy.open("a") as policy:
            policy.write("allow ana_t tool:echo.t execute # trailing comment\n")
    else:
        drop_rule(root.storage / "tool" / "echo.t.d" / "policy", "allow ana_t tool:echo.t execute")
    step, errno = DENIALS[change]
    explained, why = root.explain("ana", "echo.t")
    assert explained.rc == 1 and (why["allowed"], why["step"]) == (False, step), explained
    assert why["errno"] == errno and why["steps"][step - 1]["result"] == "deny", why
    ran = root.run("ana", "echo.t", "x")
    assert ran.rc == 126 and ran.out == "", ran
    assert ran.err.startswith(f"ctx: {errno}: step {step} "), ran
    _, result = one_call_recorded([], root.events("ana", "default"), [], root.log("echo.t"))
    assert (result["stage"], result["step"], result["errno"]) == ("authorize", step, errno)
    assert root.log("echo.t")[-1]["step"] == step


def test_disabled_tool_explained_allowed_with_a_note_and_refused_at_resolve(root: Root) -> None:
    """T-1 status, P-8 (doubtful: the status is no step of the chain): ``explain`` of a
    disabled tool walks the six steps to ``allow`` (exit 0) and notes that a call is refused
    before the chain; the call is refused ``EACCES`` at stage ``resolve`` and recorded once;
    ``ctx object list`` shows it ``disabled``."""
    granted_echo(root)
    rewrite(root.storage / "tool" / "echo.t.d" / "status", "disabled\n")
    explained, why = root.explain("ana", "echo.t")
    assert explained.rc == 0 and why["allowed"] is True, explained
    assert "refused before the chain" in explained.err and "disabled" in explained.err
    ran = root.run("ana", "echo.t")
    assert ran.rc == 126 and ran.err.startswith("ctx: EACCES: "), ran
    _, result = one_call_recorded([], root.events("ana", "default"), [], root.log("echo.t"))
    assert (result["stage"], result["errno"]) == ("resolve", "EACCES"), result
    listed = root.ctx("object", "list", "--tier", "system", "--json").json()
    assert next(e for e in listed if e["name"] == "echo.t")["status"] == "disabled"


@pytest.mark.parametrize("kind", sorted(ILLEGAL_RUNS))
def test_illegal_names_on_a_run_record_nothing(root: Root, kind: str) -> None:
    """R-3, ``ctx run --help``: an agent, tool, space or session name that is no object name
    is EINVAL, exit 2, in both modes, and nothing is run or recorded: the storage root is
    byte for byte as it was."""
    granted_echo(root)
    before = snapshot(root.storage)
    agent = ".ana" if kind == "agent name" else "ana"
    tool = "echo.t.d" if kind == "tool name" else "echo.t"
    for mode in ([], ["--native"]):
        refused = root.ctx(
            "run", "--agent", agent, *ILLEGAL_RUNS[kind], *mode, "--", tool, input="{}"
        )
        assert refused.rc == 2 and "EINVAL" in refused.err and refused.out == "", refused
    assert snapshot(root.storage) == before


REFUSED_AGENTS = {
    "the same name again": ({"name": "ana", "label": "other_t"}, 1, "EEXIST"),
    "an illegal name": ({"name": "bad.d", "label": "bad_t"}, None, "EINVAL"),
    "an unknown field": ({"name": "zed", "label": "zed_t", "policy": "allow"}, None, "EINVAL"),
    "a permission of no space": (
        {"name": "zed", "label": "zed_t", "shared": {"s": "exec"}},
        None,
        "EINVAL",
    ),
    "a mount at /ctx": (
        {"name": "zed", "label": "zed_t", "mount": [["/tmp", "/ctx/x", "ro"]]},
        None,
        "EINVAL",
    ),
    "a glob among the tools": ({"name": "zed", "label": "zed_t", "tools": ["*"]}, None, "EINVAL"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED_AGENTS))
def test_refused_agent_creations_change_nothing(root: Root, kind: str) -> None:
    """A-3, P-2, R-3: a request that is refused names its errno and leaves the storage root
    as it was; ``ctx agent list`` still names the one agent there is."""
    root.agent("ana")
    request, rc, errno = REFUSED_AGENTS[kind]
    before = snapshot(root.storage)
    refused = root.ctx("agent", "create", "-", input=json.dumps(request))
    assert refused.rc != 0 and refused.err.startswith(f"ctx: {errno}: "), refused
    if rc is not None:
        assert refused.rc == rc, refused
    assert snapshot(root.storage) == before
    listed = root.ctx("agent", "list", "--json")
    assert [a["name"] for a in listed.json()] == ["ana"], listed


@pytest.mark.parametrize("kind", sorted(BAD_INSTALLS))
def test_refused_installs_change_nothing(root: Root, kind: str) -> None:
    """T-8, T-8a, X-2: ``ctx object install`` refused (a core name in the system tier, an
    invalid manifest, a tier that does not exist or is malformed, the manual bundle) says
    its errno with the documented exit status and installs nothing."""
    root.space("p1")
    manifest, tier, rc, errno = bad_manifest(root, kind)
    before = snapshot(root.storage)
    refused = root.ctx("object", "install", manifest, "--tier", tier)
    assert refused.rc == rc and refused.err.startswith(f"ctx: {errno}: "), refused
    assert refused.out == "", refused
    assert snapshot(root.storage) == before


def test_reinstall_keeps_the_grant_status_log_and_hooks(root: Root) -> None:
    """T-8 (``ctx object install --help``): a reinstall replaces the executable and keeps the
    tool's policy, status, log and hooks; calls before and after are in the one log."""
    granted_echo(root)
    assert root.run("ana", "echo.t", "before").out == "echo.t ran before\n"
    hook = root.storage / "tool" / "echo.t.d" / "hooks" / "post.d" / "10-note"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    again = root.install("echo.t", '#!/bin/sh\necho "version 2 $*"\n')
    assert again.out.startswith("replaced echo.t in tier system: "), again
    assert hook.read_text() == "#!/bin/sh\nexit 0\n"
    ran = root.run("ana", "echo.t", "after")
    assert (ran.rc, ran.out) == (0, "version 2 after\n"), ran
    calls = [e["call"] for e in root.events("ana", "default") if e["type"] == "tool_result"]
    assert [line["call"] for line in root.log("echo.t")] == calls and len(calls) == 2


def test_a_copy_without_its_execute_bit_is_passed_over_alike(root: Root) -> None:
    """T-4, T-8a: the system copy of a tool loses its execute bits: ``ctx object which``
    passes over it (saying why) to a space's copy, ``ctx object list`` shows it damaged and
    the other available, ``ctx policy explain`` judges the space's copy and the call runs
    it, recorded under its own ``object``."""
    root.space("p1")
    root.agent("ana", tools=["echo.t"], shared={"p1": "read"})
    for tier in ("system", "shared:p1"):
        root.install("echo.t", f'#!/bin/sh\necho "from {tier}"\n', tier)
        root.grant_tool("echo.t", "ana_t", tier)
    os.chmod(root.storage / "tool" / "echo.t", 0o644)
    human = clean_env(CTX_STORAGE=str(root.storage), CTX_PATH="/ctx/tool:/ctx/shared/p1/tool")
    which = root.ctx("object", "which", "echo.t", "--json", env=human)
    assert which.rc == 0 and which.json()["path"] == str(root.tier_dir("shared:p1") / "echo.t")
    assert which.json()["skipped"] == [f"{root.storage}/tool/echo.t: not executable"], which
    listed = {e["tier"]: e["status"] for e in root.ctx("object", "list", "--json").json()
              if e["name"] == "echo.t"}  # fmt: skip
    assert listed == {"system": "damaged", "shared:p1": "available"}, listed
    explained, why = root.explain("ana", "echo.t")
    assert why["allowed"] is True and "shared/p1/tool/echo.t" in explained.out, explained
    ran = root.run("ana", "echo.t")
    assert (ran.rc, ran.out) == (0, "from shared:p1\n"), ran
    call, _ = one_call_recorded([], root.events("ana", "default"), [], None)
    assert call["object"] == "shared/p1/tool/echo.t", call


def test_the_next_call_cuts_a_torn_line_and_counts_still_agree(root: Root) -> None:
    """S-5: a torn last line is skipped by ``ctx session show`` (which says so) and cut by
    the next call before it appends; the session then holds exactly two whole events per
    call and ``ctx session repair`` has nothing to do."""
    granted_echo(root)
    root.run("ana", "echo.t", "one")
    events = root.session_dir("ana", "default") / "events.jsonl"
    with events.open("ab") as torn:
        torn.write(TORN)
    shown = root.ctx("session", "show", "ana", "--json")
    assert shown.rc == 0 and len(shown.lines()) == 2 and "torn" in shown.err, shown
    assert root.run("ana", "echo.t", "two").rc == 0
    raw = events.read_bytes()
    assert TORN not in raw and raw.endswith(b"\n") and raw.count(b"\n") == 4, raw
    assert len(root.shown("ana", "default")) == 4
    repaired = root.ctx("session", "repair", "ana", "--json")
    assert repaired.rc == 0 and repaired.json()["truncated_bytes"] == 0, repaired


def test_a_session_in_a_space_read_only_to_the_agent_makes_nothing(root: Root) -> None:
    """S-6, docs/sessions.md: an agent that may only read a space is refused a session
    there (``EACCES`` naming the step), nothing is created under the space's ``agent/``, the
    tool's log is unchanged and ``ctx session list --project`` lists nothing."""
    root.space("team")
    granted_echo(root)
    policy = root.storage / "agent" / "ana.d" / "policy"
    rewrite(policy, policy.read_text() + "allow ana_t shared:team read\n")
    explained = root.ctx("policy", "explain", "ana", "shared:team", "write", "--json")
    assert explained.rc == 1 and explained.json()["errno"] == "EACCES", explained
    step = explained.json()["step"]
    before = snapshot(root.storage)
    terminal = root.run("ana", "echo.t", project="team")
    assert terminal.rc == 126 and terminal.err.startswith(f"ctx: EACCES: step {step} ")
    native = root.run("ana", "echo.t", project="team", native=True)
    error = result_frame(native)["error"]
    assert native.rc == 1 and (error["error"], error["stage"], error["step"]) == (
        "EACCES",
        "session",
        step,
    ), native
    assert snapshot(root.storage) == before
    assert root.sessions("ana", "team") == set()


def test_a_space_made_after_the_grant_joins_the_path_and_its_tool_runs(root: Root) -> None:
    """T-4, A-3, X-1: a grant on a space not made yet is kept (with a warning) and the space
    stays on the agent's path; made with root's group it is off the path (the agent may not
    enter it), regrouped to the agent's group it is back on, and its tool runs, while the
    agent's sessions there are kept."""
    made = root.create_agent(
        {"name": "ana", "label": "ana_t", "tools": ["echo.t"], "shared": {"later": "read write"}}
    )
    assert any("later" in w for w in made["warnings"]), made
    on = f"/ctx/tool:/ctx/home/{NOBODY_UID}/tool:/ctx/shared/later/tool"
    off = f"/ctx/tool:/ctx/home/{NOBODY_UID}/tool"

    def ctx_path() -> str:
        return root.ctx("agent", "show", "ana", "--json").json()["ctx_path"]

    assert ctx_path() == on
    root.space("later", group=None)  # root's group: closed to nobody
    assert ctx_path() == off
    root.space("later")  # regrouped to nobody's group
    assert ctx_path() == on
    root.install("echo.t", '#!/bin/sh\necho "from later"\n', "shared:later")
    root.grant_tool("echo.t", "ana_t", "shared:later")
    ran = root.run("ana", "echo.t", project="later")
    assert (ran.rc, ran.out) == (0, "from later\n"), ran
    root.space("later", group=os.getegid())
    assert ctx_path() == off
    refused = root.run("ana", "echo.t", project="later")
    assert refused.rc == 126 and refused.err.startswith("ctx: EACCES: step 2 "), refused
    root.space("later")
    assert root.run("ana", "echo.t", project="later").rc == 0
    assert len(root.shown("ana", "default", "later")) == 4


def test_ctx_tool_runs_the_core_cli_only_where_which_finds_it(root: Root) -> None:
    """H-3, T-8a (``ctx tool --help``): ``ctx tool tsh.config`` runs while ``ctx object
    which`` resolves the name to the core tool; a user-tier namesake found first (the core
    copy's execute bits taken) is refused EACCES, and with neither visible it is ENOENT;
    the configuration is left as it was."""
    config = root.storage / "tool" / "tsh.d" / "config"
    kept = config.read_bytes()
    assert root.ctx("tool", "tsh.config").rc == 0
    root.install("tsh.config", "#!/bin/sh\necho impostor\n", "user")
    core = root.storage / "tool" / "tsh.config"
    os.chmod(core, 0o644)
    which = root.ctx("object", "which", "tsh.config")
    assert which.out.strip() == str(root.tier_dir("user") / "tsh.config"), which
    used = root.ctx("tool", "tsh.config", "cache_capacity=40")
    assert used.rc == 1 and used.err.startswith("ctx: EACCES: ") and "impostor" not in used.out
    os.chmod(root.tier_dir("user") / "tsh.config", 0o644)
    used = root.ctx("tool", "tsh.config")
    assert used.rc == 1 and used.err.startswith("ctx: ENOENT: "), used
    assert config.read_bytes() == kept
    os.chmod(core, 0o755)
    assert root.ctx("tool", "tsh.config").rc == 0
