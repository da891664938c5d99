"""Long sequences of ``ctx object check / install / which / list`` as an administrator (and a
user) runs them over the life of a tool (SPEC T-1, T-4, T-8, T-8a, P-6, R-4, X-1;
docs/tools.md "Manifests, version 2", "How an install stays atomic", "Listing and resolving",
"CTX_PATH").

A tool is installed, reinstalled with new versions and with the same one, disabled, made
non-executable by hand and installed again; one name is installed into the system tier, a
user tier and a shared space's tier, and ``which`` and ``list`` must say which one
``CTX_PATH`` finds; an agent's call of a shared tool runs while a tool of the same name
appears in the system tier; manifests and programs change between ``check`` and
``install``; readers look at the tier while installs follow each other; installs are killed
at random moments and at chosen steps.

What must hold: every install and reinstall is one whole version — the executable, the
controls and the ``origin`` digest agree whenever no commit marker stands — and a reinstall
keeps the local state (policy, status, log, hooks, files the administrator added) as the
same files; ``which`` follows ``CTX_PATH`` left to right and ``list`` lists each tier's copy
with the status a call would meet; a killed install leaves the old version or the new one
(a marker says when a commit is between its swaps), never goes back to an older version and
never brings back one whose commit had not begun; the next install into the tier, or
``ctx bootstrap``, settles what was left; installing grants nothing."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="installs for agents: needs root")

TOOL = "life.probe"
SPACE = "lifeteam"
SPACE_GID = 47321  # a gid no group of the host is likely to hold
# The controls every installed tool has (T-1); origin is written by every install.
CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log", "origin")

# A tool program: prints its version (and, for an agent's call, waits on a flag first).
SHELL_PROGRAM = "#!/bin/sh\n# {name} version {version}\necho '{name} v{version}'\n"
AGENT_PROGRAM = """\
#!/usr/bin/python3 -I
# {name} version {version}
import json, os, sys, time
FLAGS = {flags!r}
value = json.load(sys.stdin)
hold = value.get("hold") if isinstance(value, dict) else None
if hold:
    open(os.path.join(FLAGS, "started-" + hold), "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        os.path.exists(os.path.join(FLAGS, n)) for n in ("go-" + hold, "release")
    ):
        time.sleep(0.02)
print(json.dumps({{"version": {version!r}}}))
"""


# ================================================================================ helpers


@dataclass
class World:
    """A bootstrapped storage root every uid may search, and a scratch directory of
    manifests (one directory per tool version) and flags."""

    storage: Path
    top: Path
    background: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    @property
    def flags(self) -> Path:
        return self.top / "flags"

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def tier_dir(self, tier: str) -> Path:
        if tier == "system":
            return self.storage / "tool"
        if tier == "user":
            return self.storage / "home" / str(os.getuid()) / "tool"
        return self.storage / "shared" / tier.split(":", 1)[1] / "tool"

    def manifest(
        self,
        version: int | str,
        *,
        name: str = TOOL,
        agent_program: bool = False,
        extra: dict | None = None,
    ) -> Path:
        """Version ``version`` of tool ``name``: its own directory holding ``prog`` and
        ``manifest.json``; the description says the version, the program prints it."""
        directory = self.top / "manifests" / f"{name}-v{version}"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        template = AGENT_PROGRAM if agent_program else SHELL_PROGRAM
        program = directory / "prog"
        program.write_text(template.format(name=name, version=version, flags=str(self.flags)))
        program.chmod(0o755)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"{name} version {version}",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "prog",
        }
        document.update(extra or {})
        path = directory / "manifest.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, manifest: Path, tier: str = "system", *more: str) -> Run:
        r = self.ctx("object", "install", manifest, "--tier", tier, *more)
        assert r.rc == 0, r
        return r

    def listed(self, tier: str | None = None) -> list[dict]:
        args = ["--tier", tier] if tier else []
        r = self.ctx("object", "list", "--json", *args)
        assert r.rc == 0, r
        return r.json()

    def entry_of(self, name: str = TOOL, tier: str = "system") -> dict:
        found = [o for o in self.listed(tier) if o["name"] == name]
        assert len(found) == 1, found
        return found[0]


def version_in(text: str) -> str:
    """The version a program or a description states (``… version N``)."""
    marker = " version "
    assert marker in text, text
    return text.split(marker, 1)[1].split()[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def whole_version(directory: Path, name: str = TOOL) -> str:
    """The version of ``name`` in the tier ``directory``, checked to be one whole version:
    the executable, the description and the origin's digest agree, every control is there,
    the name control names it.  Only meaningful while no commit marker stands."""
    entry = directory / name
    controls = directory / f"{name}.d"
    assert entry.is_file() and os.access(entry, os.X_OK), entry
    for control in CONTROLS:
        assert (controls / control).is_file(), f"{controls}/{control} is missing"
    assert (controls / "name").read_text().strip() == name
    program_version = version_in(entry.read_text())
    described = version_in((controls / "description").read_text())
    origin = json.loads((controls / "origin").read_text())
    assert (program_version, origin["sha256"]) == (described, sha256(entry)), (
        f"{name}: program {program_version}, description {described}, origin {origin}"
    )
    return program_version


def marker_of(directory: Path, name: str = TOOL) -> Path:
    return directory / f".{name}~commit"


def hidden(directory: Path, name: str = TOOL) -> list[str]:
    """What installs of ``name`` left in ``directory`` (staged names, the commit marker)."""
    return sorted(n for n in os.listdir(directory) if n.startswith(f".{name}~"))


def committed_version(directory: Path, name: str = TOOL) -> int:
    """The version whose commit the marker of ``name`` stands for: that of its staged
    executable (``.<name>~<token>~entry``), or, once that was renamed into place, of the
    executable itself."""
    token = marker_of(directory, name).read_text().split()[0]
    staged = directory / f".{name}~{token}~entry"
    program = staged if staged.exists() else directory / name
    return int(version_in(program.read_text()))


def age(path: Path, seconds: float = 60) -> None:
    """Make ``path`` look ``seconds`` old: an interrupted install that happened a while ago."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__), "w")
    w = World(searchable_storage, top)
    w.flags.mkdir()
    w.flags.chmod(0o777)
    try:
        yield w
    finally:
        (w.flags / "release").touch()
        for proc in w.background:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        shutil.rmtree(top, ignore_errors=True)


def _strace_can_inject() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "inject=getpid:error=EIO:when=99",
         "true"],
        capture_output=True,
    )  # fmt: skip
    return probe.returncode == 0


def killed_at(world: World, call: str, nth: int, *args) -> subprocess.CompletedProcess:
    """``ctx ARGS`` SIGKILLed by strace as it enters its ``nth`` system call ``call``."""
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e",
            f"inject={call}:signal=SIGKILL:when={nth}", *CTX_ARGV, *map(str, args)]  # fmt: skip
    return subprocess.run(argv, capture_output=True, env=world.env, timeout=60)


# ====================================================== one tool over many versions (T-8)


def test_versions_come_and_go_while_the_local_state_stays_the_same_files(world):
    """T-8, T-1, T-8a: check, install, reinstall the same version, then new ones; the
    administrator's policy rule, a disabled status, a pre-hook, a log line and a note of
    their own in the control directory are kept as the very same files through every
    reinstall; a ``program`` control comes with the version that has one and goes with the
    next that has none; an executable made non-executable by hand is listed damaged, passed
    over by ``which``, and restored by the next reinstall; each step is listed once, with
    the status a call would meet, and ``--json`` says whether it replaced a version."""
    tier = world.storage / "tool"
    controls = tier / f"{TOOL}.d"
    v1 = world.manifest(1)
    checked = world.ctx("object", "check", v1)
    assert checked.rc == 0 and checked.out == f"{v1}: valid ({TOOL})\n", checked

    first = world.install(v1, "system", "--json").json()
    assert first == {
        "name": TOOL, "tier": "system", "path": str(tier / TOOL), "replaced": False,
        "took_leftover_controls": False,
    }  # fmt: skip
    assert whole_version(tier) == "1"
    policy_text = (controls / "policy").read_text()
    assert "allow" not in policy_text.replace("allow <label>", ""), policy_text  # grants nothing
    assert world.entry_of()["status"] == "available"

    # The administrator's local state.
    with (controls / "policy").open("a") as policy:
        policy.write("allow ops_t tool:life.probe execute\n")
    (controls / "status").write_text("disabled\n")
    hook = controls / "hooks" / "pre.d" / "10-note"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    with (controls / "log").open("a") as log:
        log.write('{"note": "kept"}\n')
    (controls / "NOTES").write_text("ask ops before changing\n")
    kept = ("policy", "status", "log", "NOTES", "hooks/pre.d/10-note")
    inodes = {name: (controls / name).stat().st_ino for name in kept}

    same = world.install(v1)
    assert same.out == f"replaced {TOOL} in tier system: {tier / TOOL}\n", same
    assert whole_version(tier) == "1"
    listed = world.entry_of()
    assert (listed["status"], listed["description"]) == ("disabled", f"{TOOL} version 1"), listed

    v2 = world.manifest(2, extra={"program": {"type": "object"}})
    assert world.install(v2, "system", "--json").json()["replaced"] is True
    assert whole_version(tier) == "2"
    assert json.loads((controls / "program").read_text()) == {"type": "object"}

    v3 = world.manifest(3)
    world.install(v3)
    assert whole_version(tier) == "3"
    assert not (controls / "program").exists(), "version 3 has no program control"
    assert {name: (controls / name).stat().st_ino for name in kept} == inodes
    assert (controls / "status").read_text() == "disabled\n"
    assert (controls / "NOTES").read_text() == "ask ops before changing\n"
    assert '{"note": "kept"}' in (controls / "log").read_text()
    assert "allow ops_t tool:life.probe execute" in (controls / "policy").read_text()

    # The executable loses its execute bits by hand: damaged, and no longer a hit.
    (tier / TOOL).chmod(0o644)
    assert world.entry_of()["status"] == "damaged"
    which = world.ctx("object", "which", TOOL, "--json")
    assert which.rc == 1 and which.json()["error"] == "ENOENT", which
    assert str(tier / TOOL) in which.json()["message"], which
    world.install(v3)
    assert (tier / TOOL).stat().st_mode & 0o777 == 0o755
    assert world.ctx("object", "which", TOOL).out == f"{tier / TOOL}\n"

    (controls / "status").write_text("available\n")
    listed = world.entry_of()
    assert (listed["status"], listed["problems"]) == ("available", []), listed
    assert [o["name"] for o in world.listed("system")].count(TOOL) == 1
    assert hidden(tier) == []


def test_what_install_takes_is_what_is_there_when_it_runs_not_what_check_saw(world):
    """T-8: ``check`` and ``install`` are two commands; an install reads the manifest and the
    program as they are when it runs.  A program replaced after the check is the one
    installed (the origin's digest says so); a manifest renamed after the check installs
    a tool of the new name beside the old; a manifest spoiled after a clean check (a field
    missing, an exec turned into a symbolic link, a program gone, a schema too large once
    written) is refused with the check's reason and leaves the installed version as it was,
    with nothing of the attempt left in the tier."""
    tier = world.storage / "tool"
    manifest = world.manifest(1)
    world.install(manifest)
    assert world.ctx("object", "check", manifest).rc == 0
    (manifest.parent / "prog").write_text(SHELL_PROGRAM.format(name=TOOL, version="1b"))
    document = json.loads(manifest.read_text())
    document["description"] = f"{TOOL} version 1b"
    manifest.write_text(json.dumps(document))
    world.install(manifest)
    assert whole_version(tier) == "1b"

    def snapshot() -> dict[str, bytes]:
        files = {TOOL: (tier / TOOL).read_bytes()}
        for entry in sorted((tier / f"{TOOL}.d").iterdir()):
            if entry.is_file():
                files[entry.name] = entry.read_bytes()
        return files

    before = snapshot()
    spoiled = []

    no_description = dict(document)
    del no_description["description"]
    spoiled.append(("EINVAL", "'description' is a required property", no_description, None))

    outside = world.top / "elsewhere"
    outside.write_text(SHELL_PROGRAM.format(name=TOOL, version="9"))
    spoiled.append(("ELOOP", "symbolic link", dict(document, exec="link"), "link"))

    spoiled.append(("EINVAL", "No such file or directory", dict(document, exec="gone"), None))

    wide = {"type": "object", "enum": list(range(120_000))}
    spoiled.append(("EFBIG", "1048576", dict(document, schema=wide), None))

    for code, says, spoiled_document, link in spoiled:
        assert world.ctx("object", "check", manifest).rc == 0
        if link:
            (manifest.parent / link).symlink_to(outside)
        manifest.write_text(json.dumps(spoiled_document))
        refused = world.ctx("object", "install", manifest, "--tier", "system")
        assert refused.rc == 1 and f"ctx: {code}: " in refused.err, refused
        assert says in refused.err, refused
        assert snapshot() == before, code
        assert hidden(tier) == [], code
        manifest.write_text(json.dumps(document))

    renamed = dict(document, name="life.probe2", description="life.probe2 version 1b")
    manifest.write_text(json.dumps(renamed))
    world.install(manifest)
    assert whole_version(tier, "life.probe2") == "1b"
    assert snapshot() == before, "the old name is left as it was"
    names = [o["name"] for o in world.listed("system")]
    assert TOOL in names and "life.probe2" in names


def test_the_origin_of_an_install_from_a_relative_path_says_where_the_manifest_was(world):
    """T-1, docs/tools.md: ``origin`` is diagnostic, "where this version came from".  An
    administrator installs from the manifest's own directory (``ctx object install
    manifest.json``); read later from anywhere, the origin must still name that manifest:
    its absolute path, not the bare name relative to a working directory long gone."""
    manifest = world.manifest(1)
    r = world.ctx("object", "install", "manifest.json", "--tier", "system", cwd=manifest.parent)
    assert r.rc == 0, r
    origin = json.loads((world.storage / "tool" / f"{TOOL}.d" / "origin").read_text())
    assert origin["manifest"] == str(manifest), origin


# ================================================== one name in three tiers (T-4, T-8a)


def test_one_name_in_three_tiers_which_follows_ctx_path_and_list_shows_each(world):
    """T-4, T-8a, R-4, X-1: ``dup`` installed into a shared space, the user tier and the
    system tier (in that order, each its own version), and ``agent.create``'s name free in
    the user tier.  ``list`` shows each copy once under its tier, in the order system, user,
    spaces, and ``--tier`` only that tier's; ``which`` gives the first executable on
    ``CTX_PATH`` (the default puts the system tier first), another order of ``CTX_PATH``
    another copy; a system copy made non-executable is passed over, named in ``--json``'s
    ``skipped``, and found again after a reinstall; a core name is refused in the system
    tier with nothing changed, while the user tier may hold it without shadowing the core
    tool."""
    made = world.ctx("shared", "create", SPACE)
    assert made.rc == 0, made
    paths = {}
    for tier, version in ((f"shared:{SPACE}", "s1"), ("user", "u1"), ("system", "y1")):
        installed = world.install(world.manifest(version, name="dup"), tier, "--json").json()
        assert installed["replaced"] is False and installed["tier"] == tier, installed
        paths[tier] = world.tier_dir(tier) / "dup"
        assert installed["path"] == str(paths[tier])
        assert whole_version(world.tier_dir(tier), "dup") == version

    dups = [o for o in world.listed() if o["name"] == "dup"]
    assert [(o["tier"], o["path"], o["description"]) for o in dups] == [
        ("system", str(paths["system"]), "dup version y1"),
        ("user", str(paths["user"]), "dup version u1"),
        (f"shared:{SPACE}", str(paths[f"shared:{SPACE}"]), "dup version s1"),
    ]
    assert {o["status"] for o in dups} == {"available"}
    assert set(dups[0]) == {"name", "tier", "path", "status", "reason", "description", "problems"}
    for tier in paths:
        assert [o["path"] for o in world.listed(tier) if o["name"] == "dup"] == [str(paths[tier])]

    def which(ctx_path: str | None = None) -> Run:
        env = world.env if ctx_path is None else dict(world.env, CTX_PATH=ctx_path)
        return world.ctx("object", "which", "dup", "--json", env=env)

    found = which().json()
    assert found["path"] == str(paths["system"]) and found["skipped"] == [], found
    assert found["controls"] == str(paths["system"]) + ".d"
    assert found["search_path"]["source"] == "default"
    found = which(f"/ctx/shared/{SPACE}/tool:/ctx/tool").json()
    assert found["path"] == str(paths[f"shared:{SPACE}"]), found
    assert found["search_path"]["source"] == "CTX_PATH"
    assert which(f"/ctx/home/{os.getuid()}/tool").json()["path"] == str(paths["user"])

    paths["system"].chmod(0o644)
    found = which().json()
    assert found["path"] == str(paths["user"]), found
    assert len(found["skipped"]) == 1 and str(paths["system"]) in found["skipped"][0], found
    world.install(world.manifest("y2", name="dup"), "system")
    assert which().json()["path"] == str(paths["system"])
    assert whole_version(world.tier_dir("system"), "dup") == "y2"
    assert whole_version(world.tier_dir("user"), "dup") == "u1"
    assert whole_version(world.tier_dir(f"shared:{SPACE}"), "dup") == "s1"

    # A second name for the same program, in another tier.
    again = world.install(world.manifest("u1", name="dup.copy"), "user")
    assert again.out.startswith("installed dup.copy in tier user: "), again
    assert world.ctx("object", "which", "dup.copy").out.strip().endswith("/tool/dup.copy")

    core = world.tier_dir("system") / "agent.create"
    core_bytes = core.read_bytes()
    refused = world.ctx(
        "object", "install", world.manifest("x", name="agent.create"), "--tier", "system"
    )
    assert refused.rc == 1 and "EEXIST" in refused.err and "core tool" in refused.err, refused
    assert core.read_bytes() == core_bytes
    assert hidden(world.tier_dir("system"), "agent.create") == []
    world.install(world.manifest("x", name="agent.create"), "user")
    assert world.ctx("object", "which", "agent.create").out == f"{core}\n"
    listed = [o["tier"] for o in world.listed() if o["name"] == "agent.create"]
    assert listed == ["system", "user"]


def test_a_tool_installed_into_an_earlier_tier_under_a_running_call_takes_the_name(world):
    """T-4, T-8, P-6: agent ``mate`` (in the space's group, ``shared:lifeteam read``) runs
    the space's ``dup``.  While a call of it runs, ``dup`` is installed into the system tier
    and the space's copy is reinstalled: the running call ends as the version it started.
    The next call finds the system copy first (the agent's ``CTX_PATH`` puts ``/ctx/tool``
    first), whose fresh policy grants nothing: refused at step 6 naming it, and the space's
    copy does not stand in for it.  Once the administrator allows it there, the system copy
    runs."""
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user")
    made = world.ctx("shared", "create", SPACE, "--group", str(SPACE_GID))
    assert made.rc == 0, made
    shared_dir = world.tier_dir(f"shared:{SPACE}")
    world.install(world.manifest("s1", name="dup", agent_program=True), f"shared:{SPACE}")
    with (shared_dir / "dup.d" / "policy").open("a") as policy:
        policy.write("allow mate_t tool:dup execute\n")
    mate = {"name": "mate", "label": "mate_t", "tools": ["dup"], "shared": {SPACE: ["read"]}}
    created = world.ctx("agent", "create", "-", "--groups", str(SPACE_GID), input=json.dumps(mate))
    assert created.rc == 0, created

    def call(value: dict) -> subprocess.Popen:
        proc = subprocess.Popen(
            [*CTX_ARGV, "run", "--native", "--agent", "mate", "dup"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=world.env,
        )  # fmt: skip
        world.background.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(value).encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    def result_of(proc: subprocess.Popen) -> tuple[int, dict]:
        out, err = proc.communicate(timeout=60)
        frames = [json.loads(line) for line in out.decode().splitlines()]
        results = [f for f in frames if f.get("type") == "result"]
        assert len(results) == 1, (proc.returncode, out, err)
        return proc.returncode, results[0]

    rc, first = result_of(call({}))
    assert rc == 0 and first["output"] == {"version": "s1"}, json.dumps(first)

    running = call({"hold": "a"})
    assert wait_for(lambda: (world.flags / "started-a").exists(), 20), "the call never ran"
    world.install(world.manifest("y1", name="dup", agent_program=True), "system")
    world.install(world.manifest("s2", name="dup", agent_program=True), f"shared:{SPACE}")
    (world.flags / "go-a").touch()
    rc, ended = result_of(running)
    assert rc == 0 and ended["output"] == {"version": "s1"}, ended
    logged = {line.get("call"): line for line in read_jsonl(shared_dir / "dup.d" / "log")}
    assert logged[ended["call"]]["status"] == "ok", "the running call's log line is lost"

    rc, refused = result_of(call({}))
    error = refused["error"]
    assert rc == 1 and (error["error"], error["step"]) == ("EACCES", 6), refused
    assert "tool/dup.d/policy" in error["message"], error
    assert f"shared/{SPACE}" not in error["message"], error
    assert refused["exit_status"] is None and refused["output"] is None, refused
    assert world.ctx("object", "which", "dup").out == f"{world.storage / 'tool' / 'dup'}\n"

    with (world.storage / "tool" / "dup.d" / "policy").open("a") as policy:
        policy.write("allow mate_t tool:dup execute\n")
    rc, system = result_of(call({}))
    assert rc == 0 and system["output"] == {"version": "y1"}, system


# ============================================ readers and writers at once (T-8, T-8a)


def test_readers_during_back_to_back_reinstalls_never_meet_a_missing_or_mixed_tool(world):
    """docs/tools.md "How an install stays atomic": while seven versions are installed one
    after the other, a reader looking by path always finds the executable and every control;
    a reader following the documented protocol (the executable looked at before and after,
    no commit marker either time) reads controls of the executable's own version; ``ctx
    object which`` always finds the tool, and ``ctx object list`` always lists it once,
    available, described as one of the versions installed."""
    tier = world.storage / "tool"
    controls = tier / f"{TOOL}.d"
    manifests = [world.manifest(v) for v in range(1, 9)]
    world.install(manifests[0])
    versions = {str(v) for v in range(1, 9)}
    problems: list[str] = []
    cli_seen: list[str] = []
    done = threading.Event()

    def installer() -> None:
        try:
            for manifest in manifests[1:]:
                r = world.ctx("object", "install", manifest, "--tier", "system")
                if r.rc != 0:
                    problems.append(repr(r))
        finally:
            done.set()

    def cli_reader() -> None:
        while not done.is_set():
            which = world.ctx("object", "which", TOOL)
            if which.rc != 0 or which.out != f"{tier / TOOL}\n":
                problems.append(f"which: {which!r}")
            mine = [o for o in world.listed("system") if o["name"] == TOOL]
            if len(mine) != 1 or mine[0]["status"] != "available":
                problems.append(f"list: {mine}")
            else:
                cli_seen.append(version_in(mine[0]["description"]))

    threads = [threading.Thread(target=installer), threading.Thread(target=cli_reader)]
    for thread in threads:
        thread.start()
    steady: set[str] = set()
    reads = 0
    try:
        while not done.is_set() and len(problems) < 5:
            reads += 1
            try:
                before = os.lstat(tier / TOOL)
                marked = marker_of(tier).exists()
                described = (controls / "description").read_text()
                for control in CONTROLS:
                    (controls / control).read_bytes()
                program = (tier / TOOL).read_text()
                marked = marked or marker_of(tier).exists()
                after = os.lstat(tier / TOOL)
            except OSError as exc:
                problems.append(f"read {reads}: {exc}")
                continue
            same = (before.st_ino, before.st_ctime_ns) == (after.st_ino, after.st_ctime_ns)
            if same and not marked:
                pair = (version_in(program), version_in(described))
                if pair[0] != pair[1]:
                    problems.append(f"read {reads}: program and controls of {pair}")
                steady.add(pair[0])
    finally:
        done.wait(60)
        for thread in threads:
            thread.join(60)
    assert problems == [], problems
    assert len(steady) >= 3 and steady <= versions, (reads, steady)
    assert cli_seen and set(cli_seen) <= versions, cli_seen
    assert whole_version(tier) == "8"
    assert hidden(tier) == []


def test_two_installs_of_a_new_tool_at_once_the_one_that_replaced_is_the_one_left(world):
    """T-8, docs/tools.md (installs of a tier take turns): three installs of one new tool,
    each its own version, started together.  Exactly one reports ``replaced: false``; the
    tool left is one whole version, and it is one of those that reported ``replaced:
    true`` — the last to take its turn; nothing of the others is left."""
    tier = world.storage / "tool"
    for round_ in range(2):
        name = f"race{round_}.probe"
        manifests = {v: world.manifest(v, name=name) for v in ("a", "b", "c")}
        procs = {
            v: subprocess.Popen(
                [*CTX_ARGV, "object", "install", m, "--tier", "system", "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=world.env,
            )
            for v, m in manifests.items()
        }
        answers = {}
        for v, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (v, out, err)
            answers[v] = json.loads(out)["replaced"]
        assert sorted(answers.values()) == [False, True, True], answers
        left = whole_version(tier, name)
        assert answers[left] is True, (left, answers)
        assert hidden(tier, name) == []


# ========================================================== installs killed (T-8, R-5)


def test_installs_killed_at_random_moments_never_go_back_nor_bring_back_a_discarded_one(world):
    """docs/tools.md "How an install stays atomic": a sequence of reinstalls, each SIGKILLed
    at a random moment around the time an install takes.  After every kill the tier holds one
    whole version (executable, controls, origin digest agree) unless the commit marker
    stands; with the marker ``list`` says ``unavailable`` (an install in progress or
    interrupted) and ``which`` still finds the tool.  The version seen never goes back to an
    older one, and a version whose install was killed before its commit began never appears
    later; the next install settles what the last one left.  At the end a clean install
    leaves its version, nothing hidden, and the administrator's policy and log as they
    were."""
    tier = world.storage / "tool"
    controls = tier / f"{TOOL}.d"
    world.install(world.manifest(0))
    with (controls / "policy").open("a") as policy:
        policy.write("allow ops_t tool:life.probe execute\n")
    with (controls / "log").open("a") as log:
        log.write('{"note": "kept"}\n')
    policy_inode = (controls / "policy").stat().st_ino

    durations = []
    for _ in range(2):
        started = time.monotonic()
        world.install(world.manifest(0))
        durations.append(time.monotonic() - started)
    typical = sum(durations) / len(durations)

    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    last = 0  # the last whole version seen
    pending: int | None = None  # the version whose commit marker stands
    discarded: set[int] = set()
    outcomes: list[tuple] = []
    for version in range(1, 9):
        manifest = world.manifest(version)
        proc = subprocess.Popen(
            [*CTX_ARGV, "object", "install", manifest, "--tier", "system"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=world.env,
        )  # fmt: skip
        time.sleep(rng.uniform(0.5 * typical, 1.1 * typical))
        proc.kill()
        rc = proc.wait()
        where = f"seed {seed}, version {version}, outcomes {outcomes}"
        allowed = {last, version} | ({pending} if pending is not None else set())
        if marker_of(tier).exists():
            marked = committed_version(tier)
            program = int(version_in((tier / TOOL).read_text()))
            described = int(version_in((controls / "description").read_text()))
            assert {program, described, marked} <= allowed, where
            assert marked in (pending, version) and not discarded & {program, described}, where
            if marked == version and pending is not None:
                last = pending  # the earlier commit was finished before this one began
            pending = marked
            age(marker_of(tier))
            listed = world.entry_of()
            assert listed["status"] == "unavailable", (where, listed)
            assert "install" in listed["reason"], (where, listed)
            assert world.ctx("object", "which", TOOL).rc == 0, where
            outcomes.append((version, rc, "marker", marked))
            continue
        seen = int(whole_version(tier))
        assert seen in ({pending, version} if pending is not None else {last, version}), where
        assert seen >= last and seen not in discarded, where
        if rc == 0:
            assert seen == version, where
        if seen != version:
            discarded.add(version)
        last, pending = seen, None
        assert world.entry_of()["status"] == "available", where
        outcomes.append((version, rc, seen))

    world.install(world.manifest(99))
    assert whole_version(tier) == "99"
    assert hidden(tier) == [], (seed, outcomes)
    assert (controls / "policy").stat().st_ino == policy_inode
    assert "allow ops_t tool:life.probe execute" in (controls / "policy").read_text()
    assert '{"note": "kept"}' in (controls / "log").read_text()
    assert world.entry_of()["status"] == "available"


@pytest.mark.skipif(not _strace_can_inject(), reason="needs strace able to inject signals")
def test_an_install_killed_between_its_swaps_is_finished_by_the_next_install_of_another_tool(
    world,
):
    """docs/tools.md: the marker stands exactly while executable and controls may be of two
    versions.  In the user tier, a reinstall of ``kt`` killed after its control directory
    was swapped (before the executable's rename): ``which`` still finds it, ``list`` says
    ``unavailable`` while the other tool of the tier stays available.  The next install into
    that tier — of another tool — finishes ``kt``'s commit: ``kt`` is the new version, whole,
    with nothing hidden left."""
    tier = world.tier_dir("user")
    world.install(world.manifest(1, name="kt"), "user")
    world.install(world.manifest(1, name="other"), "user")

    killed = killed_at(world, "renameat", 1, "object", "install",
                       world.manifest(2, name="kt"), "--tier", "user")  # fmt: skip
    assert killed.returncode == -9 or killed.returncode == 137, killed
    assert marker_of(tier, "kt").exists(), hidden(tier, "kt")
    assert version_in((tier / "kt").read_text()) == "1"
    assert version_in((tier / "kt.d" / "description").read_text()) == "2"
    assert world.ctx("object", "which", "kt").out == f"{tier / 'kt'}\n"
    age(marker_of(tier, "kt"))
    listed = {o["name"]: o for o in world.listed("user")}
    assert listed["kt"]["status"] == "unavailable", listed["kt"]
    assert listed["other"]["status"] == "available", listed["other"]

    world.install(world.manifest(2, name="other"), "user")
    assert whole_version(tier, "kt") == "2"
    assert whole_version(tier, "other") == "2"
    assert hidden(tier, "kt") == [] and hidden(tier, "other") == []
    assert world.entry_of("kt", "user")["status"] == "available"


# ============================================================ answers and their shapes


def test_json_answers_along_the_lifecycle_keep_their_shapes(world):
    """T-8, T-8a: ``check --json`` gives one entry per manifest with the same keys
    (``manifest``, ``valid``, ``name``, ``problems``, ``codes``, ``error``) whatever became
    of it; ``install --json`` one object (``name``, ``tier``, ``path``, ``replaced``) or an
    error object with exit 1 (an invalid manifest, a space never created) or 2 (a malformed
    tier); ``which --json`` of a name found nowhere is ENOENT, exit 1; nothing is installed
    by any refused command."""
    good = world.manifest(1)
    bad = world.manifest(2, name="bad.probe")
    bad.write_text(json.dumps({**json.loads(bad.read_text()), "cap": []}))
    missing = world.top / "missing.json"
    keys = {"manifest", "valid", "name", "problems", "codes", "error"}

    checked = world.ctx("object", "check", "--json", good, bad, missing)
    assert checked.rc == 1, checked
    entries = checked.json()
    assert [set(e) for e in entries] == [keys, keys, keys], entries
    assert [e["valid"] for e in entries] == [True, False, False]
    assert entries[0]["name"] == TOOL and entries[0]["problems"] == [] == entries[0]["codes"]
    assert entries[1]["name"] is None and entries[1]["codes"] == ["EINVAL"], entries[1]
    assert len(entries[1]["problems"]) == 1 and "cap" in entries[1]["problems"][0]
    assert entries[2]["error"]["error"] == "ENOENT" and entries[2]["problems"] == []

    tier = world.storage / "tool"
    before = sorted(os.listdir(tier))
    refusals = [
        (1, "EINVAL", ["object", "install", bad, "--tier", "system", "--json"]),
        (1, "ENOENT", ["object", "install", good, "--tier", "shared:nowhere", "--json"]),
        (2, "EINVAL", ["object", "install", good, "--tier", "everyone", "--json"]),
        (1, "ENOENT", ["object", "which", TOOL, "--json"]),
        (1, "ENOENT", ["object", "list", "--tier", "shared:nowhere", "--json"]),
    ]
    for rc, code, args in refusals:
        r = world.ctx(*args)
        assert r.rc == rc, r
        answer = r.json()
        assert answer["error"] == code and isinstance(answer["errno"], int), r
        assert answer["message"], r
    assert sorted(os.listdir(tier)) == before
    assert not (world.storage / "shared" / "nowhere").exists()

    installed = world.install(good, "system", "--json").json()
    assert installed == {
        "name": TOOL, "tier": "system", "path": str(tier / TOOL), "replaced": False,
        "took_leftover_controls": False,
    }  # fmt: skip
    found = world.ctx("object", "which", TOOL, "--json").json()
    assert set(found) == {"name", "path", "controls", "skipped", "search_path"}, found
    assert set(found["search_path"]) == {"ctx_path", "source", "directories"}, found
    assert world.ctx("object", "list", "--tier", "user", "--json").json() == []


# ===================================================================== a user's own tier


def test_a_user_installs_into_their_own_tier_once_an_administrator_made_their_home(
    world, unprivileged_user: UnprivilegedUser
):
    """R-4, T-8, T-8a: in root's storage root, a user's first ``--tier user`` install is
    refused (EACCES) with the ``install -d`` that makes their home, and nothing is made; once
    root made it as told, the user installs, reinstalls and finds the tool: ``which`` (their
    default ``CTX_PATH`` holds their own tier), ``list --tier user``.  Root's own lookups do
    not find it; the user may not install into the system tier (EACCES, nothing changed)."""
    user = unprivileged_user
    src = new_scratch_dir(world.top, "src")
    shutil.copytree(world.manifest(1).parent, src / "v1")
    shutil.copytree(world.manifest(2).parent, src / "v2")
    for path in (src, *src.rglob("*")):
        os.chown(path, user.uid, user.gid)
    env = clean_env(CTX_STORAGE=str(world.storage), HOME="/nonexistent")

    def as_user(*args) -> subprocess.CompletedProcess[str]:
        return run_as(user, [*CTX_ARGV, *map(str, args)], env=env, cwd=src)

    home = world.storage / "home" / str(user.uid)
    refused = as_user("object", "install", src / "v1" / "manifest.json", "--tier", "user")
    assert refused.returncode == 1 and "EACCES" in refused.stderr, refused
    assert f"install -d -o {user.uid} -g {user.gid} -m 0755 {home}" in refused.stderr, refused
    assert not home.exists()

    subprocess.run(
        ["install", "-d", "-o", str(user.uid), "-g", str(user.gid), "-m", "0755", str(home)],
        check=True,
    )
    first = as_user("object", "install", src / "v1" / "manifest.json", "--tier", "user")
    assert first.returncode == 0, first
    assert first.stdout == f"installed {TOOL} in tier user: {home / 'tool' / TOOL}\n", first
    second = as_user("object", "install", src / "v2" / "manifest.json", "--tier", "user", "--json")
    assert second.returncode == 0 and json.loads(second.stdout)["replaced"] is True, second
    assert whole_version(home / "tool") == "2"
    assert (home / "tool" / TOOL).stat().st_uid == user.uid

    which = as_user("object", "which", TOOL)
    assert which.returncode == 0 and which.stdout == f"{home / 'tool' / TOOL}\n", which
    listed = json.loads(as_user("object", "list", "--tier", "user", "--json").stdout)
    assert [(o["name"], o["tier"], o["status"]) for o in listed] == [(TOOL, "user", "available")]
    assert world.ctx("object", "which", TOOL).rc == 1
    assert TOOL not in [o["name"] for o in world.listed()]

    system_before = sorted(os.listdir(world.storage / "tool"))
    denied = as_user("object", "install", src / "v2" / "manifest.json", "--tier", "system")
    assert denied.returncode == 1 and "EACCES" in denied.stderr, denied
    assert sorted(os.listdir(world.storage / "tool")) == system_before
