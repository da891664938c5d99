"""End-to-end flows of an operator's day with damaged tool tiers (SPEC §1 R-4/R-5, §6 T-1,
T-4, T-8, T-8a, §7 H-3, §11 C-2): tools of the system tier, a user's tier and a shared
space's tier damaged the ways real life does — an executable without its ``.d/``, a ``.d/``
without its executable, a control missing, malformed, a symbolic link or a directory, a tool
file without an execute bit earlier on ``CTX_PATH``, the hidden staging an interrupted install
left — and every surface asked about each: ``ctx object list`` (text and ``--json``),
``ctx object which``, ``ctx run --agent`` in both modes, ``ctx tool``, ``ctx bootstrap`` (twice)
and the reinstall that heals the tool."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, OnStorage, Run, scratch_top
from tests.acceptance.workercli import AGENT, LABEL, allow_in_tool_policy, make_agent
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

SCRATCH = scratch_top(__file__)
# Leaves one line per run in the trace file (so a refused call provably ran nothing), then
# says who it is and what it got.
PROGRAM = """\
#!/bin/sh
echo "{word} $*" >> {trace}
echo "{word} $*"
"""
COMPLETE = "nothing to do: the storage root is complete"


def nobody_gid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_gid
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class Day(OnStorage):
    """A bootstrapped root every uid may search, agent ``ci`` (uid nobody) whose policy grants
    ``demo.day``, space ``lab`` of nobody's group that ``ci`` may read, and manifests."""

    storage: Path
    top: Path

    @property
    def trace(self) -> Path:
        return self.top / "trace"

    def ran(self) -> list[str]:
        return self.trace.read_text().splitlines() if self.trace.exists() else []

    def manifest(self, name: str, word: str, **extra) -> Path:
        src = self.top / "src" / f"{name}-{word}"
        src.mkdir(parents=True, exist_ok=True)
        (src / "prog.sh").write_text(PROGRAM.format(word=word, trace=self.trace))
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"{name} says {word}.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "prog.sh",
            **extra,
        }
        path = src / "manifest.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, manifest: Path, tier: str) -> Run:
        r = self.ctx("object", "install", manifest, "--tier", tier)
        assert r.rc == 0, r
        return r

    def tier_dir(self, tier: str) -> Path:
        if tier == "system":
            return self.storage / "tool"
        return self.storage / "shared" / tier.split(":", 1)[1] / "tool"

    def allow(self, tier: str, name: str) -> None:
        with open(self.tier_dir(tier) / f"{name}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:{name} execute\n")

    def listed(self, *args: str) -> list[dict]:
        r = self.ctx("object", "list", "--json", *args)
        assert r.rc == 0, r
        return r.json()

    def entries(self, name: str) -> dict[str, dict]:
        """``ctx object list --json``'s entries of ``name``, by tier."""
        return {t["tier"]: t for t in self.listed() if t["name"] == name}

    def text_line(self, name: str, tier: str) -> list[str]:
        r = self.ctx("object", "list")
        assert r.rc == 0, r
        return [x.split() for x in r.lines() if x.split()[:2] == [name, tier]]

    def terminal(self, tool: str, *argv: str, agent: str = AGENT) -> Run:
        return self.ctx("run", "--agent", agent, tool, *argv)

    def native(self, tool: str, value: object, agent: str = AGENT) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", agent, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def bootstrap(self) -> tuple[Run, dict]:
        # On the root the environment names, as the other commands here: the commands its
        # warnings suggest then name no --storage (they name the one a command was given).
        r = self.ctx("bootstrap", "--json")
        return r, r.json()

    def session_results(self) -> list[dict]:
        uid = pwd.getpwnam("nobody").pw_uid
        events = self.storage / "home" / str(uid) / "agent" / AGENT / "session" / "default"
        lines = (events / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["type"] == "tool_result"]


@pytest.fixture
def day(searchable_storage: Path) -> Iterator[Day]:
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="day-", dir=SCRATCH))
    top.chmod(0o1777)  # the agent's tools leave their trace here
    d = Day(searchable_storage, top)
    try:
        made = d.ctx("shared", "create", "lab", "--group", str(nobody_gid()))
        assert made.rc == 0, made
        make_agent(d.storage, ["demo.day", "tsh"])
        with open(d.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} shared:lab read\n")
        yield d
    finally:
        shutil.rmtree(top, ignore_errors=True)


def assert_refused_before_running(
    d: Day, tool: str, errno: str, stage: str, *named: str
) -> tuple[Run, dict]:
    """Both modes of ``ctx run`` refuse ``tool`` with ``errno`` at ``stage``, naming each of
    ``named``, start nothing (no ``call`` frame, no trace line) and record the refusal."""
    before = d.ran()
    term = d.terminal(tool, "t")
    assert term.rc == (127 if errno == "ENOENT" else 126) and term.out == "", term
    assert term.err.startswith(f"ctx: {errno}: "), term
    r, result = d.native(tool, {"n": 1})
    assert r.rc == 1 and len(r.lines()) == 1, r  # a result frame alone: nothing started
    assert (result["status"], result["exit_status"], result["output"]) == ("error", None, None)
    assert (result["error"]["error"], result["error"]["stage"]) == (errno, stage), result
    for word in named:
        assert word in term.err and word in result["error"]["message"], (word, term, result)
    assert d.ran() == before, "a refused call ran the tool"
    return term, result


# ====================================================================== the system tier


def test_an_executable_without_its_control_directory_is_damaged_until_reinstalled(day):
    """T-1, T-8a, T-8, R-5: the administrator's ``tool/demo.day.d/`` is lost while
    ``tool/demo.day`` stays.  ``ctx object list`` calls it damaged listing every missing
    control, ``ctx object which`` still resolves the executable, both modes of ``ctx run``
    refuse it with ``ENOEXEC`` at resolve naming the reinstall into ``--tier system`` (nothing
    runs, no control directory is made up), ``ctx bootstrap`` only warns (exit 0, never
    "complete"), and a reinstall heals it granting nothing until the rule is written again."""
    d = day
    manifest = d.manifest("demo.day", "sys")
    d.install(manifest, "system")
    d.allow("system", "demo.day")
    ok = d.terminal("demo.day", "morning")
    assert (ok.rc, ok.out) == (0, "sys morning\n"), ok
    tool = d.storage / "tool" / "demo.day"
    controls = d.storage / "tool" / "demo.day.d"
    shutil.rmtree(controls)

    [entry] = [t for t in d.listed("--tier", "system") if t["name"] == "demo.day"]
    assert (entry["path"], entry["status"], entry["reason"]) == (str(tool), "damaged", "")
    for control in ("name", "description", "schema", "cap", "policy", "status", "log"):
        assert f"demo.day.d/{control} is missing or not a regular file" in entry["problems"]
    for hooks in ("hooks/", "hooks/pre.d/", "hooks/post.d/"):
        assert f"demo.day.d/{hooks} is missing or not a directory" in entry["problems"]
    assert [line[2] for line in d.text_line("demo.day", "system")] == ["damaged"]
    which = d.ctx("object", "which", "--json", "demo.day")
    assert which.rc == 0 and which.json()["path"] == str(tool), which
    assert which.json()["controls"] == str(controls) and which.json()["skipped"] == []

    _, result = assert_refused_before_running(
        d, "demo.day", "ENOEXEC", "resolve", "demo.day.d/", "--tier system"
    )
    assert "control directory" in result["error"]["message"], result
    assert not os.path.lexists(controls)  # nothing made up for it, no log either
    allow_in_tool_policy(d.storage, "tsh")
    hidden = d.terminal("tsh", "which", "demo.day")  # the agent's view leaves it out (T-5)
    assert hidden.rc == 1 and hidden.out == "", hidden
    refused = [e for e in d.session_results() if e["object"] == "tool/demo.day"]
    assert [(e["status"], e.get("errno")) for e in refused] == [
        ("ok", None),
        ("error", "ENOEXEC"),
        ("error", "ENOEXEC"),
    ], refused

    booted, report = d.bootstrap()  # not bootstrap's to repair: a warning, exit 0
    assert booted.rc == 0 and report["problems"] == [] and report["repaired"] == [], booted
    [warning] = [w for w in report["warnings"] if "demo.day" in w]
    assert warning.startswith("tool/demo.day is damaged (") and "--tier system" in warning
    text = d.ctx("bootstrap")  # the same again, and never "complete" while it is damaged
    assert text.rc == 0 and f"warning   {warning}" in text.out and COMPLETE not in text.out
    assert not os.path.lexists(controls) and tool.is_file()

    healed = d.ctx("object", "install", manifest, "--tier", "system")
    assert healed.rc == 0 and str(tool) in healed.out, healed
    assert d.entries("demo.day")["system"]["status"] == "available"
    again = d.terminal("demo.day", "noon")
    assert again.rc == 126 and "EACCES: step 6" in again.err, again  # installing grants nothing
    d.allow("system", "demo.day")
    ok = d.terminal("demo.day", "noon")
    assert (ok.rc, ok.out) == (0, "sys noon\n"), ok
    shown = d.terminal("tsh", "which", "demo.day")
    assert (shown.rc, shown.out) == (0, "/ctx/tool/demo.day\n"), shown
    booted, report = d.bootstrap()
    assert booted.rc == 0 and not [w for w in report["warnings"] if "demo.day" in w], report


def test_a_control_directory_without_its_executable_is_never_used_nor_removed(day):
    """T-4, T-8a, T-8, R-5: ``tool/demo.day`` is deleted while ``tool/demo.day.d/`` (with the
    administrator's rule and the call log) stays.  That ``.d/`` is no tool: it is not listed,
    ``which`` and the agent's call go on to the space's ``demo.day`` whose own controls decide
    and log the call; ``ctx bootstrap`` leaves the stray directory alone (user data), and a
    reinstall into the system tier takes it back as the tool's controls, rule and log kept."""
    d = day
    d.install(d.manifest("demo.day", "sys"), "system")
    d.install(d.manifest("demo.day", "lab"), "shared:lab")
    d.allow("system", "demo.day")
    d.allow("shared:lab", "demo.day")
    assert d.terminal("demo.day", "a").out == "sys a\n"
    stray = d.storage / "tool" / "demo.day.d"
    (d.storage / "tool" / "demo.day").unlink()
    stray_log = (stray / "log").read_bytes()
    lab_tool = d.storage / "shared" / "lab" / "tool" / "demo.day"

    assert set(d.entries("demo.day")) == {"shared:lab"}
    assert d.entries("demo.day")["shared:lab"]["status"] == "available"
    assert not [t for t in d.listed() if t["name"] in ("demo.day.d", "demo.day")
                and t["tier"] == "system"]  # fmt: skip
    path = "/ctx/tool:/ctx/shared/lab/tool"
    which = d.ctx("object", "which", "--json", "demo.day", env={**d.env, "CTX_PATH": path})
    assert which.rc == 0 and which.json()["path"] == str(lab_tool), which
    assert which.json()["controls"] == str(lab_tool) + ".d", which
    gone = d.ctx("object", "which", "demo.day")  # root's default path: system, home/0
    assert gone.rc == 1 and gone.out == "" and "ENOENT" in gone.err, gone

    ran = d.terminal("demo.day", "b")
    assert (ran.rc, ran.out) == (0, "lab b\n"), ran
    r, result = d.native("demo.day", {"n": 2})
    assert r.rc == 0 and result["status"] == "ok" and result["output"].startswith("lab"), r
    assert (stray / "log").read_bytes() == stray_log  # the stray .d/ took no part
    lab_log = (lab_tool.parent / "demo.day.d" / "log").read_text()
    assert result["call"] in lab_log, lab_log

    booted, report = d.bootstrap()
    assert booted.rc == 0 and report["problems"] == [], booted
    assert not [x for x in report["repaired"] + report["warnings"] if "demo.day" in x], report
    assert (stray / "log").read_bytes() == stray_log
    assert f"allow {LABEL} tool:demo.day execute" in (stray / "policy").read_text()

    d.install(d.manifest("demo.day", "sys2"), "system")
    assert d.entries("demo.day")["system"]["status"] == "available"
    assert f"allow {LABEL} tool:demo.day execute" in (stray / "policy").read_text()
    assert (stray / "log").read_bytes().startswith(stray_log)
    back = d.terminal("demo.day", "c")
    assert (back.rc, back.out) == (0, "sys2 c\n"), back
    assert d.ctx("object", "which", "demo.day").out.strip() == str(d.storage / "tool/demo.day")


def test_a_tool_file_without_an_execute_bit_earlier_on_the_path_is_passed_over(day):
    """T-4, T-8a, H-3, R-5: ``tool/demo.day`` loses its execute bits.  ``which --json`` passes
    it over naming why and resolves the next tier; ``ctx object list`` calls the system copy
    damaged while the others stay available; the agent's calls run the space's copy; bootstrap
    warns; a reinstall makes the system copy the hit again.  ``ctx tool`` likewise passes over
    a ``tsh.config`` without an execute bit earlier on ``CTX_PATH`` and refuses one with it."""
    d = day
    d.install(d.manifest("demo.day", "sys"), "system")
    d.install(d.manifest("demo.day", "lab"), "shared:lab")
    d.allow("shared:lab", "demo.day")
    tool = d.storage / "tool" / "demo.day"
    lab_tool = d.storage / "shared" / "lab" / "tool" / "demo.day"
    tool.chmod(0o644)

    path = {**d.env, "CTX_PATH": "/ctx/tool:/ctx/shared/lab/tool"}
    which = d.ctx("object", "which", "--json", "demo.day", env=path)
    assert which.rc == 0 and which.json()["path"] == str(lab_tool), which
    assert which.json()["skipped"] == [f"{tool}: not executable"], which
    listed = d.entries("demo.day")
    assert listed["system"]["status"] == "damaged", listed
    assert listed["system"]["problems"] == ["demo.day is not an executable regular file"]
    assert listed["shared:lab"]["status"] == "available", listed

    ran = d.terminal("demo.day", "x")
    assert (ran.rc, ran.out) == (0, "lab x\n"), ran
    last = d.session_results()[-1]
    assert (last["object"], last["status"]) == ("shared/lab/tool/demo.day", "ok"), last
    booted, report = d.bootstrap()
    assert booted.rc == 0 and report["repaired"] == [], booted
    assert [w for w in report["warnings"] if "demo.day" in w] == [
        "tool/demo.day is damaged (demo.day is not an executable regular file); reinstall it "
        "with 'ctx object install MANIFEST --tier system' ('ctx bootstrap' repairs only the "
        "core tools)"
    ], report
    assert stat.S_IMODE(tool.stat().st_mode) == 0o644  # left as the administrator made it

    d.install(d.manifest("demo.day", "sys"), "system")
    assert stat.S_IMODE(tool.stat().st_mode) & 0o111
    which = d.ctx("object", "which", "demo.day", env=path)
    assert which.out.strip() == str(tool), which
    refused = d.terminal("demo.day", "y")  # the system copy is the hit: its policy decides
    assert refused.rc == 126 and "step 6" in refused.err and "tool/demo.day.d/policy" in refused.err

    # H-3: ctx tool takes the first executable tsh.config on the caller's CTX_PATH.
    mine = d.top / "mytools"
    mine.mkdir()
    (mine / "tsh.config").write_text("#!/bin/sh\necho mine\n")
    (mine / "tsh.config").chmod(0o644)
    first = {**d.env, "CTX_PATH": f"{mine}:/ctx/tool"}
    shown = d.ctx("tool", "tsh.config", env=first)
    assert shown.rc == 0 and "cache_capacity=32" in shown.out, shown
    (mine / "tsh.config").chmod(0o755)
    shadowed = d.ctx("tool", "tsh.config", env=first)
    assert shadowed.rc == 1 and shadowed.err.startswith("ctx: EACCES: "), shadowed
    assert "mine" not in shadowed.out


# ====================================================================== a space's tier


def test_controls_that_are_a_link_and_a_directory_in_a_space_block_the_reinstall_until_moved(day):
    """T-1, T-8, R-5, X-1: in space ``lab`` the tool's ``schema`` becomes a symbolic link to a
    valid copy and its ``cap`` a directory.  Every surface calls it damaged (links are not
    followed), naming ``--tier shared:lab``; bootstrap changes neither (the link's target
    untouched); the reinstall refuses to replace what is not its own (``EISDIR``, then
    ``EEXIST``, nothing changed) until each is moved away, and then heals the tool with the
    space's rule kept."""
    d = day
    manifest = d.manifest("lab.day", "lab")
    d.install(manifest, "shared:lab")
    d.allow("shared:lab", "lab.day")
    with open(d.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:lab.day execute\n")
    assert d.terminal("lab.day", "a").out == "lab a\n"
    controls = d.storage / "shared" / "lab" / "tool" / "lab.day.d"
    copy = d.top / "schema.copy"
    shutil.copyfile(controls / "schema", copy)
    copied = copy.read_bytes()
    (controls / "schema").unlink()
    (controls / "schema").symlink_to(copy)
    (controls / "cap").unlink()
    (controls / "cap").mkdir()

    [entry] = d.listed("--tier", "shared:lab")
    assert entry["status"] == "damaged", entry
    assert entry["problems"] == [
        "lab.day.d/schema is not a file (a symbolic link; links are not followed)",
        "lab.day.d/cap is missing or not a regular file",
    ], entry
    assert_refused_before_running(d, "lab.day", "ENOEXEC", "resolve", "schema", "shared:lab")
    booted, report = d.bootstrap()
    assert booted.rc == 0, booted
    [warning] = [w for w in report["warnings"] if "lab.day" in w]
    assert warning.startswith("shared/lab/tool/lab.day is damaged (lab.day.d/schema"), warning
    assert "--tier shared:lab' as the owner of shared space lab" in warning, warning
    assert os.readlink(controls / "schema") == str(copy) and copy.read_bytes() == copied
    assert (controls / "cap").is_dir()

    before = {p.name: p.lstat().st_ino for p in controls.iterdir()}
    blocked = d.ctx("object", "install", manifest, "--tier", "shared:lab")
    assert blocked.rc == 1 and blocked.err.startswith("ctx: EISDIR: "), blocked
    assert str(controls / "cap") in blocked.err and "move it away" in blocked.err, blocked
    (controls / "cap").rmdir()
    blocked = d.ctx("object", "install", manifest, "--tier", "shared:lab")
    assert blocked.rc == 1 and blocked.err.startswith("ctx: EEXIST: "), blocked
    assert str(controls / "schema") in blocked.err, blocked
    assert os.readlink(controls / "schema") == str(copy)
    assert {p.name: p.lstat().st_ino for p in controls.iterdir()} == {
        k: v for k, v in before.items() if k != "cap"
    }
    (controls / "schema").unlink()

    d.install(manifest, "shared:lab")
    assert [t["status"] for t in d.listed("--tier", "shared:lab")] == ["available"]
    ok = d.terminal("lab.day", "b")  # the space's rule was kept: no new grant was needed
    assert (ok.rc, ok.out) == (0, "lab b\n"), ok
    assert copy.read_bytes() == copied
    booted, report = d.bootstrap()
    assert booted.rc == 0 and not [x for x in report["warnings"] if "lab.day" in x], report


def test_an_interrupted_install_in_a_space_is_invisible_and_the_next_install_clears_it(day):
    """T-8, T-8a, R-5: an install into space ``lab`` died while staging (hidden
    ``.lab.day~TOKEN~controls`` with a torn schema, ``~entry`` half written, no commit marker).
    The old version stays whole for list, which and calls; the hidden names are no tool;
    the next install into that tier discards the staging and installs, leaving only the tier's
    lock file hidden."""
    d = day
    d.install(d.manifest("lab.day", "v1"), "shared:lab")
    d.allow("shared:lab", "lab.day")
    with open(d.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:lab.day execute\n")
    tier = d.storage / "shared" / "lab" / "tool"
    token = "5f3c0a1b9d2e"
    staged = tier / f".lab.day~{token}~controls"
    staged.mkdir()
    (staged / "schema").write_text('{"type": "obj')
    (tier / f".lab.day~{token}~entry").write_text("#!/bin/sh\necho torn")
    (tier / f".lab.day~{token}~entry").chmod(0o755)

    [entry] = d.listed("--tier", "shared:lab")
    assert (entry["name"], entry["status"]) == ("lab.day", "available"), entry
    assert entry["description"] == "lab.day says v1.", entry
    hidden = d.ctx("object", "which", f".lab.day~{token}~entry")
    assert hidden.rc == 2 and "EINVAL" in hidden.err and hidden.out == "", hidden
    ok = d.terminal("lab.day", "a")
    assert (ok.rc, ok.out) == (0, "v1 a\n"), ok

    d.install(d.manifest("lab.day", "v2"), "shared:lab")
    assert sorted(n for n in os.listdir(tier) if n.startswith(".")) == [".install-lock"]
    ok = d.terminal("lab.day", "b")
    assert (ok.rc, ok.out) == (0, "v2 b\n"), ok
    booted = d.ctx("bootstrap")
    assert booted.rc == 0 and COMPLETE in booted.out, booted


# ====================================================================== the core tools


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_core_tools_damaged_every_way_are_named_alike_and_repaired_once_by_bootstrap(day):
    """R-5, T-1, T-4, T-8a, H-3: ``fs.stat`` loses its executable, ``fs.list`` its control
    directory, ``shell.exec`` its execute bits, ``tsh.config`` gets a malformed ``cap`` and
    ``fs.read``'s ``schema`` becomes a link to ``/etc/passwd``.  ``ctx object list``, ``which``,
    ``ctx run`` in both modes and ``ctx tool`` each name the damage and send the operator to
    ``ctx bootstrap``, which repairs every one (saying how), keeps the administrator's policy
    and log, never follows the link, and on a second run has nothing to do."""
    d = day
    tools = d.storage / "tool"
    for name in ("fs.list", "fs.read", "fs.stat", "shell.exec"):
        allow_in_tool_policy(d.storage, name)
    with open(d.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        for name in ("fs.list", "fs.read", "fs.stat", "shell.exec"):
            policy.write(f"allow {LABEL} tool:{name} execute\n")
    assert d.ctx("tool", "tsh.config").rc == 0
    stat_policy = (tools / "fs.stat.d" / "policy").read_bytes()
    config_log = (tools / "tsh.config.d" / "log").read_bytes()
    passwd = digest(Path("/etc/passwd"))

    (tools / "fs.stat").unlink()
    shutil.rmtree(tools / "fs.list.d")
    (tools / "shell.exec").chmod(0o644)
    (tools / "tsh.config.d" / "cap").write_text('{"side_effects":')
    (tools / "fs.read.d" / "schema").unlink()
    (tools / "fs.read.d" / "schema").symlink_to("/etc/passwd")

    listed = {t["name"]: t for t in d.listed("--tier", "system")}
    assert "fs.stat" not in listed  # a control directory alone is no tool
    for name in ("fs.list", "fs.read", "shell.exec", "tsh.config"):
        assert listed[name]["status"] == "damaged", listed[name]
    assert listed["shell.exec"]["problems"] == ["shell.exec is not an executable regular file"]
    assert listed["fs.read"]["problems"] == [
        "fs.read.d/schema is not a file (a symbolic link; links are not followed)"
    ]
    [problem] = listed["tsh.config"]["problems"]
    # what is wrong, as the other entries say it: the tool and the remedy are not repeated
    assert problem.startswith("the cap control is not JSON (") and "damaged" not in problem
    assert listed["fs.write"]["status"] == "available"
    missing = d.ctx("object", "which", "fs.stat")
    assert missing.rc == 1 and missing.out == "" and "ENOENT" in missing.err, missing
    passed = d.ctx("object", "which", "shell.exec")
    assert passed.rc == 1 and f"{tools / 'shell.exec'}: not executable" in passed.err, passed

    for name in ("fs.list", "fs.read"):
        assert_refused_before_running(d, name, "ENOEXEC", "resolve", f"{name}.d", "ctx bootstrap")
    for name in ("fs.stat", "shell.exec"):
        assert_refused_before_running(d, name, "ENOENT", "resolve", name)
    config = d.ctx("tool", "tsh.config")
    assert config.rc == 1 and config.err.startswith("ctx: ENOEXEC: "), config
    assert "cap control is not JSON" in config.err and "ctx bootstrap" in config.err, config
    assert (tools / "tsh.config.d" / "log").read_bytes().startswith(config_log)

    booted, report = d.bootstrap()
    assert booted.rc == 0 and (report["problems"], report["warnings"]) == ([], []), booted
    assert report["created"] == ["tool/fs.stat"], report
    assert sorted(report["repaired"]) == [
        "tool/fs.list",
        "tool/fs.read (tool/fs.read.d/schema was a symbolic link)",
        "tool/shell.exec",
        "tool/tsh.config",
    ], report
    assert digest(Path("/etc/passwd")) == passwd
    assert not (tools / "fs.read.d" / "schema").is_symlink()
    assert json.loads((tools / "fs.read.d" / "schema").read_text())["type"] == "object"
    assert (tools / "fs.stat.d" / "policy").read_bytes() == stat_policy
    assert (tools / "tsh.config.d" / "log").read_bytes().startswith(config_log)
    assert stat.S_IMODE((tools / "shell.exec").stat().st_mode) == 0o755
    assert {t["status"] for t in d.listed("--tier", "system")} == {"available"}

    again = d.ctx("bootstrap")
    assert again.rc == 0 and COMPLETE in again.out, again
    r, result = d.native("fs.stat", {"path": "/ctx"})
    assert r.rc == 0 and result["output"]["type"] == "directory", r
    r, result = d.native("fs.read", {"path": "/ctx/shared/cortexfs-docs/README.md"})
    assert r.rc == 0 and "CortexFS" in result["output"]["content"], r
    r, result = d.native("shell.exec", {"cmd": "echo repaired"})
    assert r.rc == 0 and result["output"] == "repaired\n", r
    # fs.list lost its control directory with the rule in it: back, it grants nothing.
    r, result = d.native("fs.list", {"path": "/ctx"})
    assert (result["error"]["error"], result["error"]["step"]) == ("EACCES", 6), r
    assert d.ctx("tool", "tsh.config").rc == 0


def test_ctx_tool_names_a_damaged_safe_core_cli_once(day):
    """H-3, R-5: ``ctx tool tsh.config`` on a ``tsh.config`` whose ``cap`` is malformed is
    refused with ``ENOEXEC``; the operator reads which tool is damaged, why, and the remedy
    (``ctx bootstrap``) once, as ``ctx run`` says it, in text and ``--json`` alike."""
    d = day
    (d.storage / "tool" / "tsh.config.d" / "cap").write_text("[1,")
    text = d.ctx("tool", "tsh.config")
    as_json = d.ctx("tool", "--json", "tsh.config")
    assert text.rc == 1 and as_json.rc == 1, (text, as_json)
    message = as_json.json()["message"]
    for said in (text.err, message):
        assert said.count("is damaged") == 1, said
        assert said.count("ctx bootstrap") == 1, said


# ====================================================================== a user's own tier


@dataclass
class Desk:
    """The unprivileged test user administering a storage root of their own."""

    user: UnprivilegedUser
    top: Path

    @property
    def root(self) -> Path:
        return self.top / "st"

    @property
    def tier(self) -> Path:
        return self.root / "home" / str(self.user.uid) / "tool"

    def run(self, argv: list, stdin: str = "") -> Run:
        proc = subprocess.run(
            [str(a) for a in argv],
            input=stdin,
            user=self.user.uid,
            group=self.user.gid,
            extra_groups=[],
            umask=0o022,
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(self.top),
                "LANG": "C.UTF-8",
                "CTX_STORAGE": str(self.root),
            },
            cwd=self.top,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return Run([str(a) for a in argv[1:]], proc.returncode, proc.stdout, proc.stderr)

    def ctx(self, *args, stdin: str = "") -> Run:
        return self.run([*CTX_ARGV, *args], stdin=stdin)

    def sh(self, script: str) -> None:
        done = self.run(["/bin/sh", "-c", script])
        assert done.rc == 0, done

    def manifest(self, name: str, word: str, **extra) -> Path:
        src = self.top / "src" / name
        prog = f'#!/bin/sh\necho "{word} $*" >> {self.top}/trace\necho "{word} $*"\n'
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"{name} of mine.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "prog.sh",
            **extra,
        }
        self.sh(f"mkdir -p {src} && cat > {src}/prog.sh <<'EOF'\n{prog}EOF\n"
                f"cat > {src}/m.json <<'EOF'\n{json.dumps(document)}\nEOF\n")  # fmt: skip
        return src / "m.json"

    def ran(self) -> list[str]:
        trace = self.top / "trace"
        return trace.read_text().splitlines() if trace.exists() else []


@pytest.fixture
def desk() -> Iterator[Desk]:
    user = find_or_create_user()
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="desk-", dir=SCRATCH))
    os.chown(top, user.uid, user.gid)
    top.chmod(0o755)
    try:
        yield Desk(user, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_users_own_tier_damaged_and_half_installed_is_reported_and_healed_by_its_owner(desk):
    """R-4, R-5, T-1, T-8, T-8a, C-2: an unprivileged user keeps tools in their own tier
    (``home/<uid>/tool``) of their own root and runs them as their own agent.  One loses its
    ``schema``, one gets a ``program`` that is not JSON, and an interrupted install leaves
    staging.  List, which and both call modes agree (damaged → ``ENOEXEC``, C-2 →
    unavailable ``EACCES``), nothing runs; bootstrap as that user removes only the staging
    (saying so), warns/reports the rest with the ``--tier user`` remedy, repeats it unchanged;
    reinstalls by the user heal both and bootstrap then has nothing to do."""
    me = desk
    assert me.ctx("bootstrap").rc == 0
    a, b = me.manifest("mine.a", "a"), me.manifest("mine.b", "b", program={"type": "object"})
    for m in (a, b):
        assert me.ctx("object", "install", m, "--tier", "user").rc == 0
    made = me.ctx("agent", "create", "-", stdin=json.dumps(
        {"name": "me", "label": "me_t", "tools": ["mine.a", "mine.b"]}))  # fmt: skip
    assert made.rc == 0, made
    for name in ("mine.a", "mine.b"):
        me.sh(f"echo 'allow me_t tool:{name} execute' >> {me.tier}/{name}.d/policy")
    for name, word in (("mine.a", "a"), ("mine.b", "b")):
        ok = me.ctx("run", "--agent", "me", name, "go")
        assert (ok.rc, ok.out) == (0, f"{word} go\n"), ok

    me.sh(f"rm {me.tier}/mine.a.d/schema && printf 'object' > {me.tier}/mine.b.d/program")
    token = "0a1b2c3d4e5f"
    me.sh(f"mkdir {me.tier}/.mine.a~{token}~controls && printf '{{\"ty' > "
          f"{me.tier}/.mine.a~{token}~controls/schema && printf '#!/bin/sh' > "
          f"{me.tier}/.mine.a~{token}~entry")  # fmt: skip
    before = me.ran()

    listed = me.ctx("object", "list", "--tier", "user", "--json")
    assert listed.rc == 0, listed
    entries = {t["name"]: t for t in listed.json()}
    assert set(entries) == {"mine.a", "mine.b"}, entries  # staging is no tool
    assert entries["mine.a"]["status"] == "damaged"
    assert entries["mine.a"]["problems"] == ["mine.a.d/schema is missing or not a regular file"]
    assert entries["mine.b"]["status"] == "unavailable" and "(C-2)" in entries["mine.b"]["reason"]
    for name in ("mine.a", "mine.b"):
        which = me.ctx("object", "which", name)
        assert (which.rc, which.out.strip()) == (0, str(me.tier / name)), which
    refusals = {"mine.a": ("ENOEXEC", 126), "mine.b": ("EACCES", 126)}
    for name, (errno, code) in refusals.items():
        term = me.ctx("run", "--agent", "me", name, "x")
        assert term.rc == code and term.err.startswith(f"ctx: {errno}: "), term
        native = me.ctx("run", "--native", "--agent", "me", name, stdin="{}")
        [frame] = [json.loads(x) for x in native.lines()]
        assert native.rc == 1 and frame["type"] == "result", native
        assert (frame["error"]["error"], frame["error"]["stage"]) == (errno, "resolve"), frame
    assert "--tier user" in me.ctx("run", "--agent", "me", "mine.a").err
    assert me.ran() == before, "a refused call ran the tool"

    first = me.ctx("bootstrap", "--json")
    assert first.rc == 1, first  # the C-2 failure is a problem it leaves
    report = first.json()
    assert report["repaired"] == [
        f"{me.tier / 'mine.a'}: removed what an interrupted install left behind"
    ], report
    uid = me.user.uid
    assert [w for w in report["warnings"] if "mine." in w] == [
        f"home/{uid}/tool/mine.a is damaged (mine.a.d/schema is missing or not a regular "
        f"file); reinstall it with 'ctx object install MANIFEST --tier user' as uid {uid} "
        "('ctx bootstrap' repairs only the core tools)"
    ], report
    [problem] = [p for p in report["problems"] if "mine." in p]
    assert problem.startswith(f"home/{uid}/tool/mine.b: unavailable: ") and "program" in problem
    assert sorted(n for n in os.listdir(me.tier) if n.startswith(".")) == [".install-lock"]
    assert (me.tier / "mine.b.d" / "program").read_text() == "object"  # left untouched
    second = me.ctx("bootstrap", "--json")
    assert second.rc == 1 and second.json()["repaired"] == [], second
    assert second.json()["warnings"] == report["warnings"], second
    assert second.json()["problems"] == report["problems"], second

    for m in (a, b):
        healed = me.ctx("object", "install", m, "--tier", "user")
        assert healed.rc == 0 and "in tier user" in healed.out, healed
    listed = me.ctx("object", "list", "--tier", "user", "--json")
    assert {t["status"] for t in listed.json()} == {"available"}, listed
    for name, word in (("mine.a", "a"), ("mine.b", "b")):
        ok = me.ctx("run", "--agent", "me", name, "again")  # the rules were kept
        assert (ok.rc, ok.out) == (0, f"{word} again\n"), ok
    done = me.ctx("bootstrap")
    assert done.rc == 0 and COMPLETE in done.out, done
    owners = {p.lstat().st_uid for p in me.tier.rglob("*")} | {me.tier.stat().st_uid}
    assert owners == {uid}, owners
