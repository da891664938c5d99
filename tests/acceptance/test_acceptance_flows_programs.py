"""End-to-end flows of a tool's optional ``program`` control (SPEC §11, C-1 … C-3) and of its
other controls (T-1, T-8, T-8a) as a user meets them in every consumer at once: ``ctx run``
in both modes, a ``ctx queue work`` job, the agent's projection of ``/ctx`` (``fs.list``,
``tsh`` run as a tool, ``ctx mount --as``), ``ctx object list`` / ``which``, ``ctx
bootstrap`` and a reinstall.  A valid program grants nothing and enables nothing; a control
an administrator damaged by hand after the install makes every consumer refuse the tool
alike, naming the control, until the file is fixed or the tool reinstalled."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_mount,
    ctx_run,
    needs_fuse,
    request,
    scratch_top,
    wait_for,
)
from tests.acceptance.workercli import AGENT, LABEL, allow_in_tool_policy, make_agent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")


SCRATCH = scratch_top(__file__)
TOOL = "demo.prog"
# C-2's own example of a program: a success-result JSON Schema.
PROGRAM = {"type": "object", "additionalProperties": False}
PROGRAM_BYTES = json.dumps(PROGRAM).encode()
# Words C-1 says CortexFS never announces.
C1_WORDS = ("programmatic_tool_calling", "allowed_callers")

# Echoes its argv (terminal mode) or its JSON input (native mode, a worker's job).
ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then printf 'argv:%s\\n' "$*"; else cat; fi
"""

# A guard that only leaves a trace: it runs for every call that gets past resolve and the
# chain (T-6), so a call refused earlier leaves none.
PRE_HOOK = """\
#!/bin/sh
cat >/dev/null
echo "$CTX_CALL" >> {outbox}/pre-hook
"""


@dataclass
class World(OnStorage):
    """A bootstrapped storage root every uid may search, agent ``ci`` (nobody) allowed
    ``fs.list`` and ``tsh`` in both layers of P-6 and ``demo.prog`` in its own policy, the
    queue of project ``proj``, and ``demo.prog`` installed from a manifest with a program."""

    storage: Path
    src: Path
    outbox: Path
    jobs: int = field(default=0)

    @property
    def controls(self) -> Path:
        return self.storage / "tool" / f"{TOOL}.d"

    @property
    def program(self) -> Path:
        return self.controls / "program"

    @property
    def sessions(self) -> Path:
        """The agent's home sessions (S-1), under the uid ``ctx agent create`` gave it."""
        identity = json.loads((self.storage / "agent" / f"{AGENT}.d" / "identity").read_text())
        return self.storage / "home" / str(identity["uid"]) / "agent" / AGENT / "session"

    def manifest(self, program: object | None = PROGRAM, name: str = TOOL) -> Path:
        """A v2 manifest (T-8) beside its program; ``program`` None leaves the field out."""
        self.src.mkdir(parents=True, exist_ok=True)
        (self.src / "echo.sh").write_text(ECHO)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} test tool.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "echo.sh",
        }
        if program is not None:
            document["program"] = program
        path = self.src / f"{name}-{'with' if program is not None else 'without'}.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, manifest: Path, tier: str = "system") -> Run:
        r = self.ctx("object", "install", manifest, "--tier", tier)
        assert r.rc == 0, r
        return r

    # -- the consumers

    def terminal(self, tool: str = TOOL, *argv: str) -> Run:
        return self.ctx("run", "--agent", AGENT, tool, *argv)

    def native(self, value: object, tool: str = TOOL) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", AGENT, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def listed(self, name: str = TOOL) -> dict:
        r = self.ctx("object", "list", "--json")
        assert r.rc == 0, r
        found = [t for t in r.json() if t["name"] == name]
        assert len(found) == 1, r
        return found[0]

    def view_tools(self) -> set[str]:
        """What the agent sees in ``/ctx/tool`` (its projection, T-5), through ``fs.list``."""
        r, result = self.native({"path": "/ctx/tool"}, tool="fs.list")
        assert r.rc == 0, r
        return {e["name"] for e in result["output"]["entries"]}

    def tsh(self, *argv: str) -> Run:
        """tsh run as a tool (docs/tools.md): it reads /ctx only through the agent's view."""
        return self.terminal("tsh", *argv)

    def work(self, value: object, tool: str = TOOL, project: str = "proj") -> tuple[str, dict]:
        """One job published and drained by ``ctx queue work``: its state and result."""
        self.jobs += 1
        queue = QueueCLI(self.storage, project)
        req = request(tool)
        req["input"] = value
        job = queue.publish(req, name=f"job-{self.jobs}")
        r = queue.run("work", "--agent", AGENT, "--drain", "--json")
        assert r.rc == 0, r
        events = [json.loads(line) for line in r.lines()]
        assert events[-1]["event"] == "stop" and events[-1]["lost"] == 0, events
        assert queue.entries("claimed") == set() and queue.entries("lease") == set()
        state = queue.state(job)
        assert state in ("done", "failed"), (job, state)
        return state, json.loads((queue.dir / state / f"{job}.result").read_text())

    def bootstrap(self) -> tuple[Run, dict]:
        r = ctx_run("bootstrap", "--storage", self.storage, "--json")
        return r, r.json()

    def pre_hook_calls(self) -> list[str]:
        trace = self.outbox / "pre-hook"
        return trace.read_text().split() if trace.exists() else []


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    SCRATCH.mkdir(exist_ok=True)
    src = Path(tempfile.mkdtemp(prefix="src-", dir=SCRATCH))
    outbox = Path(tempfile.mkdtemp(prefix="outbox-", dir=SCRATCH))
    outbox.chmod(0o1777)
    w = World(searchable_storage, src, outbox)
    try:
        w.install(w.manifest())
        make_agent(w.storage, [TOOL, "fs.list", "tsh"])
        allow_in_tool_policy(w.storage, "fs.list")
        allow_in_tool_policy(w.storage, "tsh")
        yield w
    finally:
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(outbox, ignore_errors=True)


def add_pre_hook(w: World) -> None:
    hook = w.controls / "hooks" / "pre.d" / "10-trace"
    hook.write_text(PRE_HOOK.format(outbox=w.outbox))
    hook.chmod(0o755)


def assert_works_everywhere(w: World, tag: str) -> None:
    """Every consumer runs or shows the tool: both modes of ``ctx run``, a worker's job,
    the agent's view (``fs.list``, tsh's ``which``) and ``ctx object list``."""
    term = w.terminal(TOOL, tag)
    assert (term.rc, term.out) == (0, f"argv:{tag}\n"), term
    r, result = w.native({"tag": tag})
    assert r.rc == 0 and result["status"] == "ok" and result["output"] == {"tag": tag}, r
    state, res = w.work({"tag": tag})
    assert state == "done" and res["output"] == {"tag": tag}, res
    assert TOOL in w.view_tools() and f"{TOOL}.d" in w.view_tools()
    which = w.tsh("which", TOOL)
    assert (which.rc, which.out.strip()) == (0, f"/ctx/tool/{TOOL}"), which
    listed = w.listed()
    assert (listed["status"], listed["reason"], listed["problems"]) == ("available", "", [])


def assert_refused_everywhere(w: World, errno: str, stage: str, control: str) -> list[str]:
    """Every consumer refuses the tool with the same errno and stage, naming ``control``;
    the texts each gave are returned."""
    hooked = len(w.pre_hook_calls())
    term = w.terminal(TOOL, "x")
    assert term.rc == 126 and term.out == "", term  # refused: the shell's convention
    assert term.err.startswith(f"ctx: {errno}: ") and control in term.err, term

    r, result = w.native({"tag": "x"})
    assert r.rc == 1 and result["status"] == "error" and result["exit_status"] is None, r
    assert (result["error"]["error"], result["error"]["stage"]) == (errno, stage), result
    assert control in result["error"]["message"], result
    assert [json.loads(line)["type"] for line in r.lines()] == ["result"], r  # never started

    state, res = w.work({"tag": "x"})
    assert state == "failed", res  # finished with the reason, not lost nor left claimed
    assert res["error"]["error"] == errno and res["error"]["stage"] == stage, res
    assert res["reason"].startswith(f"{errno}: ") and control in res["reason"], res

    assert TOOL not in w.view_tools() and f"{TOOL}.d" not in w.view_tools()
    gone = w.tsh("which", TOOL)
    assert gone.rc == 1 and gone.out == "", gone

    # The session has the refusal as an ordinary tool_call/tool_result pair (S-2, T-7).
    lines = (w.sessions / "default" / "events.jsonl").read_text().splitlines()
    pair = [json.loads(x) for x in lines if json.loads(x).get("call") == result["call"]]
    assert [e["type"] for e in pair] == ["tool_call", "tool_result"], pair
    assert pair[1]["object"] == f"tool/{TOOL}", pair
    assert (pair[1]["status"], pair[1]["errno"], pair[1]["stage"]) == ("error", errno, stage)

    assert len(w.pre_hook_calls()) == hooked, "a hook ran for a refused call"
    return [term.err, result["error"]["message"], res["reason"]]


# ====================================================================== a valid program


def test_flow_a_valid_program_works_in_every_consumer_and_grants_and_announces_nothing(world):
    """C-2, T-8, P-6, C-1: a manifest with a valid program checks and installs; the program
    control is the author's schema, and the tool is available yet refused by every consumer
    (``EACCES`` at step 6) until the tool's own policy allows it — then it runs everywhere,
    called the single-call way; no output anywhere announces programmatic tool calling."""
    w = world
    checked = w.ctx("object", "check", "--json", w.manifest())
    assert checked.rc == 0 and checked.json()[0]["valid"] is True, checked
    assert json.loads(w.program.read_text()) == PROGRAM
    assert w.listed()["status"] == "available"
    add_pre_hook(w)

    # Installed with a program, granted by the agent's policy only: nothing runs (P-6).
    texts = assert_refused_everywhere(w, "EACCES", "authorize", f"tool/{TOOL}.d/policy")
    assert all("step 6" in text for text in texts), texts
    explained = w.ctx("policy", "explain", "--json", AGENT, f"tool:{TOOL}", "execute")
    assert explained.rc == 1 and explained.json()["step"] == 6, explained

    allow_in_tool_policy(w.storage, TOOL)
    assert_works_everywhere(w, "granted")
    assert len(w.pre_hook_calls()) == 3  # terminal, native, the worker's job

    # C-1: the single-call protocol is the only one; nothing names PTC or its callers.
    r, result = w.native({"tag": "c1"})
    outputs = [
        r.out,
        json.dumps(result),
        w.ctx("object", "list", "--json").out,
        w.ctx("object", "which", "--json", TOOL).out,
        w.ctx("agent", "show", AGENT, "--json").out,
        w.tsh("tools").out,
        w.tsh("describe", TOOL).out,
        json.dumps(w.work({"tag": "c1"})[1]),
        (w.controls / "log").read_text(),
    ]
    outputs += [p.read_text() for p in w.sessions.glob("*/events.jsonl")]
    for text in outputs:
        for word in C1_WORDS:
            assert word not in text, (word, text)
    assert "programmatic_tool_calling" not in w.view_tools()
    assert not (w.storage / "tool" / "programmatic_tool_calling").exists()
    # The program is no output schema either (C-1): an output it would refuse is the result.
    r, result = w.native({"extra": [1, 2]})
    assert r.rc == 0 and result["output"] == {"extra": [1, 2]}, r


# ====================================================================== a program damaged


def kind_of(path: Path) -> tuple:
    """What is at ``path``, never following a link: its type, size and (a file) bytes."""
    st = path.lstat()
    small = stat.S_ISREG(st.st_mode) and st.st_size < 4096
    return (stat.S_IFMT(st.st_mode), st.st_size, path.read_bytes() if small else None)


def write(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def symlink_to_a_valid_program(path: Path) -> None:
    target = path.with_name("program.kept")  # a file of the administrator's beside it
    target.write_bytes(PROGRAM_BYTES)
    path.unlink()
    path.symlink_to(target)


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def sparse(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(2 << 30)


# (damage, errno and stage of a call, status in ctx object list, bootstrap's verdict)
PROGRAM_DAMAGES = {
    "not-an-object": (
        write(b'[{"type": "object"}]'),
        "EACCES",
        "resolve",
        "unavailable",
        "problem",
    ),
    "fails-the-meta-schema": (
        write(b'{"type": "objekt"}'),
        "EACCES",
        "resolve",
        "unavailable",
        "problem",
    ),
    "a-symlink": (symlink_to_a_valid_program, "ENOEXEC", "resolve", "damaged", "warning"),
    "a-fifo": (fifo, "ENOEXEC", "resolve", "damaged", "warning"),
    "sparse-2-gib": (sparse, "EFBIG", "resolve", "damaged", "warning"),
}


@pytest.mark.parametrize("case", list(PROGRAM_DAMAGES))
def test_flow_a_program_damaged_after_install_is_refused_alike_by_every_consumer(world, case):
    """C-2, T-1, T-8a, W-1, T-5, R-5: an administrator damages a working tool's program
    control by hand (not an object, not a valid JSON Schema, a link, a FIFO, a sparse
    file past the 1 MiB limit of a control).  Both modes of ``ctx run`` (exit 126), a worker's
    job (failed with the reason, not lost), the agent's view and tsh, ``ctx object list`` and
    ``ctx bootstrap`` all treat it as unusable, naming the program control, no hook running;
    putting the file right restores it everywhere."""
    w = world
    damage, errno, stage, status, verdict = PROGRAM_DAMAGES[case]
    allow_in_tool_policy(w.storage, TOOL)
    add_pre_hook(w)
    assert w.terminal(TOOL, "before").out == "argv:before\n"
    policy = (w.controls / "policy").read_bytes()

    damage(w.program)
    damaged = kind_of(w.program)

    texts = assert_refused_everywhere(w, errno, stage, "program")
    if status == "unavailable":
        assert all("(C-2)" in text for text in texts), texts
    listed = w.listed()
    assert listed["status"] == status, listed
    assert any("program" in problem for problem in listed["problems"]), listed
    if status == "unavailable":
        assert "program" in listed["reason"] and "C-2" in listed["reason"], listed
        line = [x for x in w.ctx("object", "list").lines() if x.startswith(TOOL + " ")]
        assert len(line) == 1 and "unavailable" in line[0] and "(C-2)" in line[0], line
    # T-8a: the name still resolves to the same executable (its call is refused after).
    found = w.ctx("object", "which", TOOL)
    assert (found.rc, found.out.strip()) == (0, str(w.storage / "tool" / TOOL)), found

    booted, report = w.bootstrap()
    said = [x for x in report["problems"] + report["warnings"] if f"tool/{TOOL}" in x]
    assert len(said) == 1 and "program" in said[0], report
    if verdict == "problem":  # docs/tools.md: "… unavailable: …; left untouched", exit 1
        assert booted.rc == 1 and said[0] in report["problems"], booted
        assert said[0].startswith(f"tool/{TOOL}: unavailable: ") and "left untouched" in said[0]
    else:  # a damaged tool not bootstrap's own: a warning naming the reinstall, exit 0
        assert booted.rc == 0 and said[0] in report["warnings"], booted
        assert "ctx object install" in said[0], said
    # Bootstrap left the control as the administrator made it, and the policy too.
    assert kind_of(w.program) == damaged
    assert (w.controls / "policy").read_bytes() == policy

    # Put right by hand: a regular file holding a valid schema again.
    w.program.unlink()
    w.program.write_bytes(PROGRAM_BYTES)
    assert_works_everywhere(w, "after")
    booted, report = w.bootstrap()
    assert booted.rc == 0 and not any(TOOL in x for x in report["problems"] + report["warnings"])


def test_flow_reinstalls_put_a_damaged_program_right_and_keep_the_administrators_state(world):
    """C-2, T-8: the remedy the refusal names — reinstall with a valid program, or without
    one — makes the tool available everywhere again with its policy, log and hooks kept (a
    reinstall grants nothing new and takes nothing); a FIFO at the program's place is not
    the install's to replace (``EEXIST``, nothing changed) until moved away, and a program
    removed altogether is fine (missing is allowed)."""
    w = world
    allow_in_tool_policy(w.storage, TOOL)
    add_pre_hook(w)
    assert w.terminal(TOOL, "first").rc == 0
    log_lines = len((w.controls / "log").read_text().splitlines())

    w.program.write_bytes(b"read-only, deterministic")  # prose, not a schema
    refused = w.terminal(TOOL, "x")
    assert refused.rc == 126 and "program" in refused.err, refused
    assert "reinstall it with a valid program control, or without one" in refused.err, refused

    # Reinstalled without a program: the control goes, the tool's local state stays.
    replaced = w.ctx("object", "install", w.manifest(program=None), "--tier", "system")
    assert replaced.rc == 0 and "replaced" in replaced.out, replaced
    assert not os.path.lexists(w.program)
    assert f"allow {LABEL} tool:{TOOL} execute" in (w.controls / "policy").read_text()
    assert (w.controls / "hooks" / "pre.d" / "10-trace").exists()
    assert len((w.controls / "log").read_text().splitlines()) == log_lines + 1  # the refusal
    assert_works_everywhere(w, "without")

    # Reinstalled with one: back as the author wrote it, still working.
    w.install(w.manifest(program={"type": "object"}))
    assert json.loads(w.program.read_text()) == {"type": "object"}
    assert w.terminal(TOOL, "with").out == "argv:with\n"

    # A FIFO where the program belongs is nobody's data: a reinstall refuses to replace it.
    fifo(w.program)
    assert_refused_everywhere(w, "ENOEXEC", "resolve", "program")
    again = w.ctx("object", "install", w.manifest(), "--tier", "system")
    assert again.rc == 1 and again.err.startswith("ctx: EEXIST: "), again
    assert str(w.program) in again.err, again
    assert stat.S_ISFIFO(w.program.lstat().st_mode)
    w.program.unlink()  # moved away: a tool without a program is a whole tool (C-2)
    assert_works_everywhere(w, "no-program")
    w.install(w.manifest())
    assert json.loads(w.program.read_text()) == PROGRAM
    assert w.listed()["status"] == "available"
    assert w.terminal(TOOL, "reinstalled").out == "argv:reinstalled\n"


def test_flow_a_core_tool_given_a_broken_program_is_refused_until_bootstrap_repairs_it(world):
    """C-2, R-5, T-8: an administrator adds a malformed program to the core tool ``fs.list``:
    every consumer refuses it naming the control, a manifest of that name cannot be installed
    over it (it is bootstrap's), and ``ctx bootstrap`` puts this version's ``fs.list`` back
    (its policy kept, no program) so that every consumer has it again."""
    w = world
    controls = w.storage / "tool" / "fs.list.d"
    policy = (controls / "policy").read_bytes()
    (controls / "program").write_bytes(b'{"type": ["object", 3]}')

    r, result = w.native({"path": "/ctx"}, tool="fs.list")
    assert r.rc == 1 and result["error"]["error"] == "EACCES", r
    assert result["error"]["stage"] == "resolve" and "program" in result["error"]["message"]
    term = w.terminal("fs.list", "/ctx")
    assert term.rc == 126 and "program" in term.err and "(C-2)" in term.err, term
    state, res = w.work({"path": "/ctx"}, tool="fs.list")
    assert state == "failed" and "program" in res["reason"], res
    assert w.tsh("which", "fs.list").rc == 1  # gone from the agent's view of /ctx/tool
    listed = w.listed("fs.list")
    assert listed["status"] == "unavailable" and "program" in listed["reason"], listed
    over = w.ctx("object", "install", w.manifest(name="fs.list"), "--tier", "system")
    assert over.rc == 1 and over.err.startswith("ctx: EEXIST: fs.list is a core tool"), over

    booted, report = w.bootstrap()
    assert booted.rc == 0 and "tool/fs.list" in report["repaired"], report
    assert not os.path.lexists(controls / "program")
    assert (controls / "policy").read_bytes() == policy
    assert w.listed("fs.list")["status"] == "available"
    assert "fs.list" in w.view_tools()
    state, res = w.work({"path": "/ctx"}, tool="fs.list")
    assert state == "done" and "tool" in {e["name"] for e in res["output"]["entries"]}, res


# What ``ctx object check`` refuses in a manifest's program as not strict JSON (docs/tools.md:
# "a key given twice in one object … is EINVAL …, and so are NaN and Infinity").
NOT_STRICT_JSON = {
    "nan": b'{"type": "object", "minimum": NaN}',
    "a-key-twice": b'{"type": "object", "type": "string"}',
}


@pytest.mark.parametrize("case", list(NOT_STRICT_JSON))
def test_flow_a_program_install_would_refuse_is_not_taken_from_disk_either(world, case):
    """C-2: the program is "validated by object install, layout checks and bootstrap" with
    one verdict: the bytes that make ``ctx object check`` refuse a manifest's program (not
    JSON: ``NaN``, a key given twice) make the installed tool unavailable when an
    administrator writes them into the control, for ``ctx object list``, a call and
    ``ctx bootstrap`` alike."""
    w = world
    allow_in_tool_policy(w.storage, TOOL)
    text = NOT_STRICT_JSON[case]
    manifest = w.src / "strict.json"
    manifest.write_bytes(w.manifest().read_bytes().replace(json.dumps(PROGRAM).encode(), text))
    checked = w.ctx("object", "check", manifest)
    assert checked.rc == 1 and "EINVAL" in checked.err, checked  # install's verdict

    w.program.write_bytes(text)

    listed = w.listed()
    term = w.terminal(TOOL, "x")
    booted, report = w.bootstrap()
    assert listed["status"] == "unavailable" and "program" in listed["reason"], listed
    assert term.rc == 126 and "program" in term.err, term
    assert booted.rc == 1 and any(f"tool/{TOOL}" in x for x in report["problems"]), report


# ====================================================================== the other controls


def schema_not_a_json_schema(w: World) -> None:
    (w.controls / "schema").write_text('{"type": "objekt"}')


def description_missing(w: World) -> None:
    (w.controls / "description").unlink()


def policy_missing(w: World) -> None:
    (w.controls / "policy").unlink()


# (damage, errno and stage of a call, the control the refusals name)
CONTROL_DAMAGES = {
    "schema-not-a-json-schema": (schema_not_a_json_schema, "ENOEXEC", "resolve", "schema"),
    "description-missing": (description_missing, "ENOEXEC", "resolve", "description"),
    "policy-missing": (policy_missing, "EACCES", "authorize", "policy"),
}


@pytest.mark.parametrize("case", list(CONTROL_DAMAGES))
def test_flow_another_control_damaged_after_install_is_refused_alike_until_reinstalled(world, case):
    """T-1, T-8, P-6, R-5, W-1: a tool with a valid program whose ``schema`` is made
    invalid, whose ``description`` or ``policy`` is removed by hand: every consumer refuses
    it alike, naming the control (``ENOEXEC`` at resolve; a missing policy allows nothing,
    ``EACCES`` at step 6), ``ctx object list`` calls it damaged, ``ctx bootstrap`` warns
    with the reinstall command (exit 0), and ``ctx object install`` puts it right — a lost
    policy comes back granting nothing, so calls stay refused until the rule is written."""
    w = world
    damage, errno, stage, control = CONTROL_DAMAGES[case]
    allow_in_tool_policy(w.storage, TOOL)
    add_pre_hook(w)
    assert w.terminal(TOOL, "before").out == "argv:before\n"

    damage(w)

    texts = assert_refused_everywhere(w, errno, stage, control)
    if control == "policy":
        assert all("step 6" in text for text in texts), texts
    listed = w.listed()
    assert listed["status"] == "damaged", listed
    assert any(control in problem for problem in listed["problems"]), listed
    booted, report = w.bootstrap()
    assert booted.rc == 0, booted
    said = [x for x in report["warnings"] if f"tool/{TOOL}" in x]
    assert len(said) == 1 and "damaged" in said[0] and control in said[0], report
    assert "ctx object install" in said[0] and "--tier system" in said[0], said
    assert json.loads(w.program.read_text()) == PROGRAM  # the program is not the problem

    w.install(w.manifest())
    assert w.listed()["status"] == "available"
    if control == "policy":  # installing grants nothing (T-8)
        refused = w.terminal(TOOL, "x")
        assert refused.rc == 126 and "EACCES: step 6" in refused.err, refused
        assert TOOL not in w.view_tools()
        allow_in_tool_policy(w.storage, TOOL)
    assert_works_everywhere(w, "after")


# ====================================================================== a shared space's tool


def test_flow_a_spaces_tool_with_a_broken_program_fails_the_spaces_jobs_until_reinstalled(world):
    """C-2, X-1, T-4, W-1, R-5: a tool installed into a shared space with a program, run by
    the space's worker as an agent that reads the space; its program made malformed by
    hand: the space's jobs and calls fail with the C-2 reason, ``ctx object list --tier
    shared:lab`` and ``ctx bootstrap`` name it; a reinstall into the same tier restores
    them."""
    w = world
    try:
        nobody_gid = pwd.getpwnam("nobody").pw_gid
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")
    made = w.ctx("shared", "create", "lab", "--group", str(nobody_gid))
    assert made.rc == 0, made
    manifest = w.manifest(name="lab.prog")
    w.install(manifest, tier="shared:lab")
    agent_policy = w.storage / "agent" / f"{AGENT}.d" / "policy"
    with agent_policy.open("a") as policy:
        policy.write(f"allow {LABEL} tool:lab.prog execute\nallow {LABEL} shared:lab read\n")
    controls = w.storage / "shared" / "lab" / "tool" / "lab.prog.d"
    with (controls / "policy").open("a") as policy:
        policy.write(f"allow {LABEL} tool:lab.prog execute\n")

    state, res = w.work({"n": 1}, tool="lab.prog", project="lab")
    assert state == "done" and res["output"] == {"n": 1}, res
    which = w.tsh("which", "lab.prog")
    assert (which.rc, which.out.strip()) == (0, "/ctx/shared/lab/tool/lab.prog"), which

    (controls / "program").write_bytes(b"object")
    state, res = w.work({"n": 2}, tool="lab.prog", project="lab")
    assert state == "failed" and res["error"]["error"] == "EACCES", res
    assert "program" in res["reason"] and "(C-2)" in res["reason"], res
    # docs/mount.md: a space the agent may read is shown as it is (only the root's tool/ is
    # filtered), so tsh still finds the name there; the call is what is refused.
    term = w.terminal("lab.prog", "x")
    assert term.rc == 126 and "program" in term.err, term
    listed = w.ctx("object", "list", "--tier", "shared:lab", "--json")
    assert listed.rc == 0, listed
    [entry] = [t for t in listed.json() if t["name"] == "lab.prog"]
    assert entry["status"] == "unavailable" and "program" in entry["reason"], entry
    booted, report = w.bootstrap()
    assert booted.rc == 1, booted
    assert any(
        x.startswith("shared/lab/tool/lab.prog: unavailable: ") and "program" in x
        for x in report["problems"]
    ), report

    w.install(manifest, tier="shared:lab")
    state, res = w.work({"n": 3}, tool="lab.prog", project="lab")
    assert state == "done" and res["output"] == {"n": 3}, res
    assert w.tsh("which", "lab.prog").rc == 0
    assert w.bootstrap()[0].rc == 0


# ====================================================================== ctx mount --as


def view_tools(view: Path) -> set[str]:
    return set(os.listdir(view / "tool"))


@needs_fuse
def test_flow_the_agents_mounted_view_drops_a_tool_whose_program_breaks_and_shows_it_again(
    world, tmp_path
):
    """F-1, T-5, C-2: ``ctx mount --as ci`` lists and executes a tool with a valid program
    that both policies allow; a program made malformed, then a link, by hand hides the tool
    and its control directory from the agent's view (``ENOENT``) within about a second while
    the host view still shows both; fixed, it is listed and runs again."""
    w = world
    allow_in_tool_policy(w.storage, TOOL)
    agent_view, host_view = tmp_path / "agent", tmp_path / "host"
    with ctx_mount(w.storage, agent_view, "--as", AGENT), ctx_mount(w.storage, host_view):
        assert {TOOL, f"{TOOL}.d"} <= view_tools(agent_view)
        shown = json.loads((agent_view / "tool" / f"{TOOL}.d" / "program").read_text())
        assert shown == PROGRAM
        ran = ctx_run("run", "--agent", AGENT, TOOL, "ok", env=w.env)
        assert ran.out == "argv:ok\n", ran
        executed = subprocess.run(
            [agent_view / "tool" / TOOL, "through-the-view"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
            env=clean_env(),
        )  # fmt: skip
        assert (executed.returncode, executed.stdout) == (0, "argv:through-the-view\n")

        for damage in (write(b"{"), symlink_to_a_valid_program):
            damage(w.program)
            assert wait_for(lambda: TOOL not in view_tools(agent_view), 3, 0.02), damage
            assert f"{TOOL}.d" not in view_tools(agent_view)
            hidden = agent_view / "tool" / TOOL
            assert wait_for(lambda: not os.path.lexists(hidden), 3, 0.02), damage  # noqa: B023
            assert {TOOL, f"{TOOL}.d"} <= view_tools(host_view)
            assert os.path.lexists(host_view / "tool" / f"{TOOL}.d" / "program")

            w.program.unlink()
            w.program.write_bytes(PROGRAM_BYTES)
            assert wait_for(lambda: TOOL in view_tools(agent_view), 3, 0.02), damage
            assert os.access(agent_view / "tool" / TOOL, os.X_OK)
