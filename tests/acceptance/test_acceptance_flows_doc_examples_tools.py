"""docs/tools.md and docs/mount.md taken literally, as a new user copies them (SPEC §1, §6, §7,
§11, §13): the ``text.upper`` manifest and the ``ctx object check``/``install`` session printed
beside it, the listing examples (``fs.read``, ``hello``), how a manifest's program is read, the
native ``fs.read`` frames, the "Errors you will see" table, the core tools' rules and the
tool's environment, ``ctx tool``, and the refusals and promises of ``ctx mount``/``umount``.
Each case runs the printed command through the real command line on a fresh storage root and
compares what it prints, its exit status and what it leaves on disk with the page."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    scratch_top,
    serving,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

SCRATCH = scratch_top(__file__)

# docs/tools.md "Manifests, version 2": the example manifest, character for character.
TEXT_UPPER_MANIFEST = """\
{
  "manifest": 2,
  "kind": "tool",
  "name": "text.upper",
  "description": "Upper-cases the text it is given.",
  "schema": {"type": "object", "properties": {"text": {"type": "string"}},
             "required": ["text"], "additionalProperties": false},
  "cap": {"side_effects": false, "network": false},
  "exec": "bin/text-upper",
  "program": {"type": "object"}
}
"""
TEXT_UPPER_PROGRAM = """\
#!/usr/bin/python3
import json, sys
print(json.dumps({"text": json.load(sys.stdin)["text"].upper()}))
"""
# Prints the call's environment, working directory and argv as one JSON object.
ENV_DUMP = """\
#!/usr/bin/python3
import json, os, sys
print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv[1:]}))
"""
CALL_FRAME = {"type", "call", "tool", "agent", "session", "pid", "ts"}
RESULT_FRAME = {
    "type", "status", "tool", "agent", "session", "call", "mode", "output", "exit_status",
    "error", "stderr", "post_hooks", "started", "finished", "timings_ms",
}  # fmt: skip
ERROR_KEYS = {"error", "errno", "stage", "step", "step_name", "message"}


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class Desk:
    """A user's directory: a storage root made by ``ctx bootstrap``, a workspace holding
    ``a.txt`` ("data\\n") and agent ``coder`` (uid nobody) with it mounted at /workspace."""

    top: Path

    @property
    def root(self) -> Path:
        return self.top / "storage"

    @property
    def ws(self) -> Path:
        return self.top / "ws"

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def run(self, tool: str, *argv: str, **kw) -> Run:
        return self.ctx("run", "--agent", "coder", tool, *argv, **kw)

    def native(self, tool: str, value, *options: str) -> tuple[Run, list[dict]]:
        text = value if isinstance(value, str) else json.dumps(value)
        r = self.ctx("run", "--agent", "coder", "--native", *options, tool, input=text)
        return r, [json.loads(line) for line in r.lines()]

    def manifest(self, name: str, code: str, **fields) -> Path:
        """A v2 manifest of ``name`` beside its program ``p``, in ``src/<name>/``."""
        src = self.top / "src" / name
        src.mkdir(parents=True, exist_ok=True)
        (src / "p").write_text(code)
        document = {"manifest": 2, "kind": "tool", "name": name, "description": "d",
                    "schema": {"type": "object"}, "cap": {}, "exec": "p", **fields}  # fmt: skip
        (src / "m.json").write_text(json.dumps(document))
        return src / "m.json"

    def batch(self, commands: list[tuple[tuple, str]]) -> list[Run]:
        """``ctx ARGS`` with its standard input, for each command, all started together (calls
        of one agent's session append to it side by side, S-5); their Runs in order."""
        procs = [
            subprocess.Popen([*CTX_ARGV, *map(str, args)], env=self.env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for args, _ in commands
        ]  # fmt: skip
        runs = []
        for proc, (args, stdin) in zip(procs, commands, strict=True):
            out, err = proc.communicate(stdin.encode(), timeout=60)
            runs.append(Run([str(a) for a in args], proc.returncode, out.decode(), err.decode()))
        return runs

    def install(self, manifest: Path, tier: str = "system") -> None:
        r = self.ctx("object", "install", manifest, "--tier", tier)
        assert r.rc == 0, r

    def install_all(self, manifests: list[Path]) -> None:
        """``ctx object install`` of each manifest, started together (installs into one tier
        take turns under its lock)."""
        procs = [
            subprocess.Popen([*CTX_ARGV, "object", "install", str(m), "--tier", "system"],
                             env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for m in manifests
        ]  # fmt: skip
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (out, err)

    def allow(self, tool: str, *, agent: bool = True, own: bool = True) -> None:
        """``allow coder_t tool:<tool> execute`` in the agent's and/or the tool's policy."""
        rule = f"allow coder_t tool:{tool} execute\n"
        places = [self.root / "agent" / "coder.d" / "policy"] if agent else []
        places += [self.root / "tool" / f"{tool}.d" / "policy"] if own else []
        for policy in places:
            with policy.open("a") as f:
                f.write(rule)

    def events(self) -> list[dict]:
        path = self.root / "home" / str(nobody().pw_uid) / "agent" / "coder" / "session"
        path = path / "default" / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def desk(_template: Path) -> Iterator[Desk]:
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="desk-", dir=SCRATCH))
    top.chmod(0o755)
    desk = Desk(top)
    try:
        copy_of_root(_template, desk.root)
        desk.ws.mkdir()
        desk.ws.chmod(0o777)
        (desk.ws / "a.txt").write_text("data\n")
        yield desk
    finally:
        shutil.rmtree(top, ignore_errors=True)


def make_coder(desk: Desk) -> None:
    """``ctx agent create`` as root without ``--user``: the two lines docs/tools.md prints."""
    user = nobody()
    request = {"name": "coder", "label": "coder_t",
               "tools": ["fs.read", "fs.write", "fs.list", "fs.stat", "shell.exec"],
               "mount": [[str(desk.ws), "/workspace", "rw"]]}  # fmt: skip
    (desk.top / "coder.json").write_text(json.dumps(request))
    made = desk.ctx("agent", "create", desk.top / "coder.json")
    assert made.rc == 0, made
    assert made.lines() == [
        f"created agent coder: {desk.root}/agent/coder (uid {user.pw_uid}, gid {user.pw_gid})",
        "it runs as user nobody: an agent never runs as root, so that is root's default; "
        "choose another with --user",
    ], made
    for tool in request["tools"]:
        desk.allow(tool, agent=False)


def listing_line(listed: Run, name: str) -> str:
    [line] = [line for line in listed.lines() if line.split()[0] == name]
    return line


# ====================================================================== manifests (T-8)


def test_the_text_upper_manifest_checks_installs_lists_and_runs_as_printed(desk: Desk) -> None:
    """T-8, T-8a, T-1, T-4, P-6: the page's manifest and the ``other.json`` beside it are
    checked in one command (exit 1, one line per reason), the valid one installed with
    ``--source`` (the printed ``installed …`` line), its control directory is T-1's table with
    a policy that grants nothing, ``list``/``which`` show it, and once both policies allow it
    the tool upper-cases its input while its schema refuses anything else (exit 2)."""
    src = desk.top / "src"
    (src / "bin").mkdir(parents=True)
    (src / "text.upper.json").write_text(TEXT_UPPER_MANIFEST)
    (src / "bin" / "text-upper").write_text(TEXT_UPPER_PROGRAM)
    assert not os.path.lexists("/src/missing")
    (src / "other.json").write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "../x", "schema": {"type": "object"},
        "cap": {}, "exec": "/src/missing"}))  # fmt: skip

    check = ctx_run("object", "check", "text.upper.json", "other.json", cwd=src)
    assert check.rc == 1, check
    assert check.out == "text.upper.json: valid (text.upper)\n", check
    problems = check.err.splitlines()
    assert len(problems) == 3, check
    assert problems[0] == "other.json: EINVAL: manifest: 'description' is a required property"
    assert problems[1].startswith(
        "other.json: EINVAL: name: '../x' must start with a letter or digit, not '.'; "
        "and it holds '/'"
    ), check
    assert problems[2] == "other.json: EINVAL: exec: /src/missing: No such file or directory"

    as_json = ctx_run("object", "check", "--json", "text.upper.json", "other.json", cwd=src)
    assert as_json.rc == 1, as_json
    valid, other = as_json.json()
    keys = {"manifest", "valid", "name", "problems", "codes", "error"}
    assert set(valid) == set(other) == keys, as_json
    assert valid == {"manifest": "text.upper.json", "valid": True, "name": "text.upper",
                     "problems": [], "codes": [], "error": None}  # fmt: skip
    assert (other["valid"], other["name"], other["error"]) == (False, None, None), other
    assert other["codes"] == ["EINVAL"] * 3, other
    assert [f"other.json: EINVAL: {p}" for p in other["problems"]] == problems

    # The printed install: --source names the root; $CTX_STORAGE is not even set.
    installed = ctx_run("object", "install", "--source", desk.root, "text.upper.json",
                        "--tier", "system", cwd=src)  # fmt: skip
    tool = desk.root / "tool" / "text.upper"
    assert (installed.rc, installed.out) == (
        0, f"installed text.upper in tier system: {tool}\n"), installed  # fmt: skip

    # T-1: the executable and its control directory, as the page's table lists them.
    controls = desk.root / "tool" / "text.upper.d"
    assert tool.is_file() and os.access(tool, os.X_OK)
    assert (controls / "name").read_text() == "text.upper\n"
    assert (controls / "description").read_text().strip() == "Upper-cases the text it is given."
    manifest = json.loads(TEXT_UPPER_MANIFEST)
    for control in ("schema", "cap", "program"):
        assert json.loads((controls / control).read_text()) == manifest[control], control
    assert (controls / "status").read_text().strip() == "available"
    log = controls / "log"
    assert log.read_text() == "" and stat.S_IMODE(log.stat().st_mode) == 0o640
    assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
    # "A new tool's policy holds only a comment": installing grants nothing.
    policy = (controls / "policy").read_text().splitlines()
    assert policy and all(not line.strip() or line.startswith("#") for line in policy), policy
    lock = desk.root / "tool" / ".install-lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600

    listed = desk.ctx("object", "list")
    assert listed.rc == 0, listed
    assert listing_line(listed, "text.upper").split(None, 3) == [
        "text.upper", "system", "available", "Upper-cases the text it is given."]  # fmt: skip
    assert listing_line(listed, "fs.read").split(None, 3)[:3] == ["fs.read", "system", "available"]
    assert (
        listing_line(listed, "fs.read")
        .split(None, 3)[3]
        .startswith("Read a file inside the agent's visible mounts: ")
    )
    entries = {e["name"]: e for e in desk.ctx("object", "list", "--json").json()}
    assert entries["text.upper"] == {
        "name": "text.upper", "tier": "system", "path": str(tool), "status": "available",
        "reason": "", "description": "Upper-cases the text it is given.", "problems": [],
    }  # fmt: skip
    if not os.path.ismount("/ctx"):
        for name in ("fs.read", "text.upper"):
            which = desk.ctx("object", "which", name)
            assert (which.rc, which.out) == (0, f"{desk.root}/tool/{name}\n"), which

    # P-6: nobody may run it until both policies hold the rule; then it does its job.
    make_coder(desk)
    refused = desk.run("text.upper", input='{"text": "hi"}')
    assert refused.rc == 126 and "step 5 (object policy)" in refused.err, refused
    desk.allow("text.upper", own=False)
    refused = desk.run("text.upper", input='{"text": "hi"}')
    assert refused.rc == 126, refused
    assert refused.err.startswith("ctx: EACCES: step 6 (tool/model policy): "), refused
    desk.allow("text.upper", agent=False)
    ran, frames = desk.native("text.upper", {"text": "hi"})
    assert (ran.rc, frames[-1]["output"]) == (0, {"text": "HI"}), ran
    extra, frames = desk.native("text.upper", {"text": "hi", "loud": True})
    assert extra.rc == 2, extra
    assert (frames[-1]["error"]["error"], frames[-1]["error"]["stage"]) == ("EINVAL", "schema")
    # T-7: one line per call; a reinstall keeps policy and log as the very same files.
    kept = {name: (controls / name).stat().st_ino for name in ("policy", "log")}
    logged = log.read_text()
    assert len(logged.splitlines()) == 4, logged
    again = ctx_run("object", "install", "--source", desk.root, "text.upper.json",
                    "--tier", "system", cwd=src)  # fmt: skip
    assert again.rc == 0, again
    assert {name: (controls / name).stat().st_ino for name in kept} == kept
    assert log.read_text() == logged


def test_strict_manifests_core_names_and_oversized_controls_are_refused_as_written(
    desk: Desk,
) -> None:
    """T-8, R-3, R-5: each rule of the field table and the strict-JSON paragraph — a key given
    twice, ``NaN``/``Infinity``, a non-boolean ``side_effects``, a ``policy`` field, both
    ``exec`` and ``mcp``, a name ending in ``.d`` — is one ``EINVAL`` line (exit 1); a manifest
    of a core tool's name is ``EEXIST`` with nothing changed; a schema that would exceed a
    control's 1 MiB once written indented is ``EFBIG`` at install, with nothing installed."""
    base = {"manifest": 2, "kind": "tool", "description": "d", "schema": {"type": "object"},
            "cap": {}, "exec": "p"}  # fmt: skip
    src = desk.top / "src" / "strict"
    src.mkdir(parents=True)
    (src / "p").write_text("#!/bin/sh\n")

    def text(**fields) -> str:
        return json.dumps({**base, **fields})

    faults = {
        "dup.json": text(name="t.dup")[:-1] + ', "exec": "p"}',
        "nan.json": text(name="t.nan", schema={"type": "object", "maximum": 1}).replace(
            '"maximum": 1', '"maximum": NaN'),
        "inf.json": text(name="t.inf", cap={"gpu": 1}).replace('"gpu": 1', '"gpu": Infinity'),
        "cap.json": text(name="t.cap", cap={"side_effects": "no"}),
        "policy.json": text(name="t.pol", policy="allow x_t tool:t.pol execute"),
        "both.json": text(name="t.both", mcp={"transport": "stdio", "config": "/mcp/m.json",
                                              "server": "t", "tool": "both"}),
        "dotd.json": text(name="t.d"),
    }  # fmt: skip
    for name, body in faults.items():
        (src / name).write_text(body)
    checked = ctx_run("object", "check", "--json", *faults, cwd=src)
    assert checked.rc == 1, checked
    verdicts = {e["manifest"]: e for e in checked.json()}
    for name in faults:
        entry = verdicts[name]
        assert (entry["valid"], entry["codes"]) == (False, ["EINVAL"]), entry
    assert "'exec' twice" in verdicts["dup.json"]["problems"][0]
    assert "NaN" in verdicts["nan.json"]["problems"][0]
    assert "Infinity" in verdicts["inf.json"]["problems"][0]
    assert "side_effects" in verdicts["cap.json"]["problems"][0]
    assert "'policy'" in verdicts["policy.json"]["problems"][0]
    assert "exactly one of 'exec'" in verdicts["both.json"]["problems"][0]
    assert "ends in '.d'" in verdicts["dotd.json"]["problems"][0]
    # cap is any JSON object: {} declares nothing (and so counts as the cautious value).
    (src / "empty-cap.json").write_text(text(name="t.empty"))
    fine = ctx_run("object", "check", "empty-cap.json", cwd=src)
    assert (fine.rc, fine.out) == (0, "empty-cap.json: valid (t.empty)\n"), fine

    # The core tools belong to bootstrap: "EEXIST: fs.read is a core tool, maintained by …".
    (src / "fs.read.json").write_text(text(name="fs.read"))
    before = (desk.root / "tool" / "fs.read").read_bytes()
    core = desk.ctx("object", "install", src / "fs.read.json", "--tier", "system")
    assert core.rc == 1, core
    assert core.err.startswith("ctx: EEXIST: fs.read is a core tool, maintained by 'ctx bootstrap'")
    assert (desk.root / "tool" / "fs.read").read_bytes() == before

    # 35 000 properties: under 1 MiB as written compactly, over it once indented.
    props = {f"p{i:05d}": {"type": "string"} for i in range(35000)}
    big = json.dumps({**base, "name": "big.schema", "schema": {"type": "object",
                      "properties": props}}, separators=(",", ":"))  # fmt: skip
    assert len(big) < 1 << 20
    (src / "big.json").write_text(big)
    tier = sorted(os.listdir(desk.root / "tool"))
    refused = desk.ctx("object", "install", src / "big.json", "--tier", "system")
    assert refused.rc == 1 and refused.err.startswith("ctx: EFBIG: "), refused
    assert "schema" in refused.err and "1048576" in refused.err, refused
    assert sorted(os.listdir(desk.root / "tool")) == tier


def test_a_manifests_program_is_never_reached_through_a_link_or_past_its_authors_modes(
    desk: Desk, unprivileged_user: UnprivilegedUser
) -> None:
    """T-8 ("How the manifest and its program are read"): ``"exec": "prog"`` with ``prog ->
    /etc/shadow`` and ``"bin/tool"`` with ``bin -> /etc`` are ``ELOOP`` naming the link and its
    target; a manifest that is a FIFO is ``EINVAL``, never waited on; in another uid's
    manifest an absolute ``exec``, a program that uid may not read, or one below a ``0700``
    directory it may not pass is ``EACCES`` naming the uid (and the directory), and install
    refuses it too; made readable, the same manifest is valid."""
    drop = desk.top / "drop"
    ws = drop / "ws"
    ws.mkdir(parents=True)
    drop.chmod(0o755)
    ws.chmod(0o755)

    def manifest(path: Path, name: str, program: str) -> Path:
        path.write_text(json.dumps({"manifest": 2, "kind": "tool", "name": name,
                                    "description": "d", "schema": {"type": "object"},
                                    "cap": {}, "exec": program}))  # fmt: skip
        return path

    (ws / "prog").symlink_to("/etc/shadow")
    (ws / "bin").symlink_to("/etc")
    linked = manifest(ws / "m.json", "t.link", "prog")
    through = manifest(ws / "m2.json", "t.through", "bin/passwd")
    os.mkfifo(ws / "fifo.json")
    check = ctx_run("object", "check", linked, through, ws / "fifo.json", timeout=20)
    assert check.rc == 1, check
    lines = sorted(check.err.splitlines())
    assert len(lines) == 3, check
    assert lines[0].startswith(f"{ws}/fifo.json: EINVAL: "), check
    assert lines[1].startswith(
        f"{linked}: ELOOP: exec: {ws}/prog: prog is a symbolic link (to /etc/shadow), "
    ), check
    assert lines[2].startswith(
        f"{through}: ELOOP: exec: {ws}/bin/passwd: bin is a symbolic link (to /etc), "
    ), check
    entries = ctx_run("object", "check", "--json", linked, through, ws / "fifo.json").json()
    assert [e["codes"] for e in entries] == [["ELOOP"], ["ELOOP"], []], entries
    assert [e["error"] for e in entries[:2]] == [None, None], entries
    unread = entries[2]
    assert (unread["valid"], unread["problems"], unread["error"]["error"]) == (False, [], "EINVAL")
    assert set(unread["error"]) == {"error", "errno", "message"}, unread
    # A manifest that is not there at all is an ``error`` too, and its line says ENOENT.
    absent = ctx_run("object", "check", ws / "absent.json")
    assert absent.rc == 1 and absent.err.startswith(f"{ws}/absent.json: ENOENT: "), absent

    # Another uid's manifests.
    uid = unprivileged_user.uid
    private = drop / "private"
    private.mkdir(mode=0o700)
    (private / "key").write_text("secret\n")
    (private / "key").chmod(0o644)
    absolute = manifest(ws / "abs.json", "t.abs", str(private / "key"))
    (ws / "sub").mkdir()
    (ws / "sub" / "t.sh").write_text("#!/bin/sh\n")
    (ws / "sub" / "t.sh").chmod(0o600)
    unreadable = manifest(ws / "unreadable.json", "t.unreadable", "sub/t.sh")
    behind = manifest(private / "m.json", "t.behind", "key")
    for path in (absolute, unreadable, behind):
        os.chown(path, uid, -1)
    check = ctx_run("object", "check", "--json", absolute, unreadable, behind)
    assert check.rc == 1, check
    by_name = {Path(e["manifest"]).name: e for e in check.json()}
    for entry in by_name.values():
        assert entry["codes"] == ["EACCES"], entry
    assert f"belongs to uid {uid}" in by_name["abs.json"]["problems"][0]
    assert f"not readable by uid {uid}, who owns the manifest" in (
        by_name["unreadable.json"]["problems"][0])  # fmt: skip
    assert by_name["m.json"]["problems"][0].startswith(
        f"exec: {private}/key: uid {uid}, who owns the manifest {behind}, may not pass "
        f"{private} (uid 0, gid 0, mode 0700)"
    ), by_name["m.json"]
    refused = desk.ctx("object", "install", unreadable, "--tier", "system")
    assert refused.rc == 1 and "EACCES" in refused.err, refused
    assert not (desk.root / "tool" / "t.unreadable").exists()
    (ws / "sub" / "t.sh").chmod(0o644)
    fine = ctx_run("object", "check", unreadable)
    assert (fine.rc, fine.out) == (0, f"{unreadable}: valid (t.unreadable)\n"), fine


# ====================================================================== listing (T-8a, C-2)


def test_the_listing_examples_statuses_which_and_ctx_tool_say_what_the_page_prints(
    desk: Desk,
) -> None:
    """T-8a, C-2, T-1, R-5, H-3: the page's ``hello`` row (``unavailable … (the program
    control is not JSON: it is empty (C-2))``) and bootstrap's ``left untouched`` problem; a
    core tool an administrator ``disabled`` is neither rewritten nor reported by bootstrap and
    a reinstall keeps a tool's ``unavailable: <reason>``; a tool whose ``policy`` is gone is
    ``damaged`` yet refused at step 6; ``which`` names what to do when nothing is found;
    ``ctx tool`` refuses the permission-bearing core tools and ordinary tools."""
    hello = desk.manifest("hello", "#!/bin/sh\necho hello\n", description="Say hello",
                          program={"type": "object"})  # fmt: skip
    gone = desk.manifest("x.gone", "#!/bin/sh\necho ok\n")
    desk.install_all([hello, gone])
    program = desk.root / "tool" / "hello.d" / "program"
    program.write_text("")
    listed = desk.ctx("object", "list")
    assert re.fullmatch(
        r"hello\s+system\s+unavailable\s+Say hello  "
        r"\(the program control is not JSON: it is empty \(C-2\)\)",
        listing_line(listed, "hello"),
    ), listed
    booted = desk.ctx("bootstrap")
    assert booted.rc == 1, booted
    assert ("problem   tool/hello: unavailable: the program control is not JSON: it is empty "
            "(C-2); left untouched") in booted.lines(), booted  # fmt: skip
    assert program.read_text() == ""
    desk.install(hello)  # "reinstall the tool to fix it"
    assert json.loads(program.read_text()) == {"type": "object"}

    # status: the administrator's setting, kept by bootstrap and by a reinstall.
    (desk.root / "tool" / "fs.stat.d" / "status").write_text("disabled\n")
    (desk.root / "tool" / "hello.d" / "status").write_text("unavailable: moving hosts\n")
    booted = desk.ctx("bootstrap", "--json")
    assert booted.rc == 0, booted
    assert "fs.stat" not in booted.out and "hello" not in booted.out, booted
    assert (desk.root / "tool" / "fs.stat.d" / "status").read_text() == "disabled\n"
    desk.install(hello)
    assert (desk.root / "tool" / "hello.d" / "status").read_text() == "unavailable: moving hosts\n"
    rows = {e["name"]: e for e in desk.ctx("object", "list", "--json").json()}
    assert (rows["fs.stat"]["status"], rows["hello"]["status"]) == ("disabled", "unavailable")
    assert rows["hello"]["reason"] == "moving hosts", rows["hello"]
    make_coder(desk)
    desk.allow("hello")
    for name in ("fs.stat", "hello"):
        refused, frames = desk.native(name, {"path": "a.txt"})
        assert refused.rc == 1, refused
        error = frames[-1]["error"]
        assert (error["error"], error["stage"]) == ("EACCES", "resolve"), frames[-1]

    # A missing own policy: damaged in the listing, refused by the chain at step 6.
    desk.allow("x.gone", own=False)
    (desk.root / "tool" / "x.gone.d" / "policy").unlink()
    row = next(e for e in desk.ctx("object", "list", "--json").json() if e["name"] == "x.gone")
    assert row["status"] == "damaged" and any("policy" in p for p in row["problems"]), row
    refused = desk.run("x.gone")
    assert refused.rc == 126, refused
    assert refused.err.startswith("ctx: EACCES: step 6 (tool/model policy): no policy"), refused
    explained = desk.ctx("policy", "explain", "coder", "tool:x.gone", "execute")
    assert "deny: EACCES: step 6 (tool/model policy): no policy" in explained.out, explained

    # which: what was passed over, or what to do.
    nowhere = desk.ctx("object", "which", "no.such")
    assert (nowhere.rc, nowhere.out) == (1, ""), nowhere
    assert nowhere.err.startswith("ctx: ENOENT: no.such is not on CTX_PATH (") and (
        "'ctx object list'" in nowhere.err), nowhere  # fmt: skip
    (desk.root / "tool" / "hello").chmod(0o644)
    skipped = desk.ctx("object", "which", "hello")
    assert skipped.rc == 1 and f"{desk.root}/tool/hello: not executable" in skipped.err
    bare = desk.top / "bare"
    for entry in ROOT_ENTRIES - {"tool"}:
        (bare / entry).mkdir(parents=True)
    empty = ctx_run("object", "which", "fs.read", env=clean_env(CTX_STORAGE=str(bare)))
    assert empty.rc == 1 and f"'ctx bootstrap --storage {bare}'" in empty.err, empty
    no_root = ctx_run("object", "list", env=clean_env(CTX_STORAGE=str(desk.top / "typo")))
    assert no_root.rc == 1 and no_root.err.startswith("ctx: ENOENT: storage root "), no_root
    user_tier = desk.ctx("object", "list", "--tier", "user")
    assert (user_tier.rc, user_tier.out) == (0, ""), user_tier

    # ctx tool (H-3): only the safe core CLI runs; the others are named and refused.
    for name, why in (("shell.exec", "a core tool that acts with an agent's permissions"),
                      ("x.gone", "an ordinary tool")):  # fmt: skip
        refused = desk.ctx("tool", name)
        assert refused.rc == 1 and refused.err.startswith(f"ctx: EACCES: {name} is {why}")
    missing = desk.ctx("tool", "no.such")
    assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: no.such is not on CTX_PATH")


# ====================================================================== ctx run (T-3)


def test_the_native_fs_read_example_and_each_exit_status_of_ctx_run(desk: Desk) -> None:
    """T-3, T-7, S-2: the page's ``{"path": "/workspace/a.txt"}`` call gives the printed
    ``call`` and ``result`` frames (same keys, the same ``output``, the session of the
    agent's home) and exit 0; input failing the schema is the table's ``EINVAL … at /path:
    42 is not of type 'string'`` and input that is not JSON ``EINVAL`` at stage ``schema``
    (exit 2); a missing agent is named with ``ctx agent list`` (exit 1, 126 in terminal
    mode); a missing ``--agent``, a timeout past a year and a day and stdin over 16 MiB are
    refused as printed, the last with nothing recorded; frames to ``/dev/full`` exit 74."""
    make_coder(desk)
    uid = nobody().pw_uid
    session = f"home/{uid}/agent/coder/session/default"
    ok, frames = desk.native("fs.read", {"path": "/workspace/a.txt"})
    assert ok.rc == 0, ok
    call, result = frames
    assert set(call) == CALL_FRAME and set(result) == RESULT_FRAME, frames
    assert (call["type"], call["tool"], call["agent"], call["session"]) == (
        "call", "fs.read", "coder", session)  # fmt: skip
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", call["ts"]), call
    assert isinstance(call["pid"], int) and call["call"] == result["call"]
    assert re.fullmatch(r"[0-9a-f]{16}", call["call"]), call
    assert result["output"] == {"path": "/workspace/a.txt", "size": 5, "offset": 0,
                                "content": "data\n", "encoding": "utf-8",
                                "truncated": False}  # fmt: skip
    assert (result["status"], result["mode"], result["exit_status"], result["error"],
            result["stderr"], result["post_hooks"], result["session"]) == (
        "ok", "native", 0, None, "", [], session)  # fmt: skip
    assert {"resolve", "authorize", "run", "total", "record"} <= set(result["timings_ms"])
    # Terminal mode and a "--" before TOOL: plain text, the tool's exit status.
    plain = desk.ctx("run", "--agent", "coder", "--", "fs.read", "a.txt")
    assert (plain.rc, plain.out) == (0, "data\n"), plain

    bad, frames = desk.native("fs.read", {"path": 42})
    assert bad.rc == 2, bad
    assert set(frames[-1]["error"]) == ERROR_KEYS
    assert (frames[-1]["error"]["stage"], frames[-1]["error"]["message"]) == (
        "schema", "input does not match the schema of fs.read: at /path: 42 is not of type "
        "'string'")  # fmt: skip
    garbage, frames = desk.native("fs.read", "nope")
    assert garbage.rc == 2, garbage
    assert (frames[-1]["error"]["error"], frames[-1]["error"]["stage"]) == ("EINVAL", "schema")

    ghost = desk.ctx("run", "--agent", "ghost", "--native", "fs.read", input="{}")
    assert ghost.rc == 1, ghost
    error = json.loads(ghost.lines()[-1])["error"]
    assert (error["error"], error["stage"]) == ("ENOENT", "agent"), error
    for words in ("'ctx agent list'", "'ctx agent create REQUEST.json'"):
        assert words in error["message"], error
    ghost = desk.ctx("run", "--agent", "ghost", "fs.read")
    assert ghost.rc == 126 and "'ctx agent create REQUEST.json'" in ghost.err, ghost

    usage = desk.ctx("run", "fs.read")
    assert usage.rc == 2 and usage.out == "", usage
    assert usage.err.startswith("Usage: ctx run ") and usage.err.endswith(
        "ctx: EINVAL: Missing option '--agent'.\n"), usage  # fmt: skip
    too_long = desk.ctx("run", "--agent", "coder", "--timeout", "31622401", "fs.read", "a.txt")
    assert too_long.rc == 2 and "31622400" in too_long.err, too_long
    longest = desk.ctx("run", "--agent", "coder", "--timeout", "31622400", "fs.read", "a.txt")
    assert (longest.rc, longest.out) == (0, "data\n"), longest

    recorded = len(desk.events())
    huge = desk.ctx("run", "--agent", "coder", "--native", "fs.read",
                    input=b'"' + b"a" * (16 << 20) + b'"')  # fmt: skip
    assert (huge.rc, huge.out) == (1, ""), huge.rc
    assert huge.err.startswith("ctx: EFBIG: ") and "16777216" in huge.err, huge.err[:300]
    assert len(desk.events()) == recorded

    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [*CTX_ARGV, "run", "--agent", "coder", "--native", "fs.read"],
            input=b'{"path": "a.txt"}', stdout=full, stderr=subprocess.PIPE,
            env=desk.env, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 74, proc
    err = proc.stderr.decode()
    assert err.startswith("ctx: ENOSPC: cannot write standard output (") and (
        "fs.read was killed before it was given its input (its process had started); "
        f"the call is recorded in session {session}") in err, err  # fmt: skip


def test_every_row_of_the_errors_table_is_what_ctx_run_prints(desk: Desk) -> None:
    """T-3, T-1, T-6, P-5, P-6 (docs/tools.md "Errors you will see"): each row's message is
    produced by a tool set up to meet it — no tool on the path (exit 127), mode bits
    (step 2), the agent's policy (step 5), the tool's policy (step 6), a pre-hook veto, a
    schema control that is not JSON (``ENOEXEC``), a sparse 2 GiB ``cap`` (``EFBIG`` naming the
    1 MiB limit), an executable the agent owns (not host-owned), a timeout — exit 126 for a
    refusal, and in native mode the stage each belongs to."""
    make_coder(desk)
    uid = nobody().pw_uid
    names = ("x.mode", "x.five", "x.six", "x.hook", "x.dmg", "x.big", "x.own", "x.slow")
    desk.install_all([desk.manifest(name, "#!/bin/sh\necho ok\n") for name in names])
    for name in names:
        desk.allow(name, agent=name != "x.five", own=name != "x.six")
    tool = desk.root / "tool"
    (tool / "x.mode").chmod(0o750)
    guard = tool / "x.hook.d" / "hooks" / "pre.d" / "10-guard"
    guard.write_text('#!/bin/sh\necho "the guard refuses" >&2\nexit 3\n')
    guard.chmod(0o755)
    (tool / "x.dmg.d" / "schema").write_text("not json\n")
    os.truncate(tool / "x.big.d" / "cap", 2 << 30)
    os.chown(tool / "x.own", uid, -1)
    (tool / "x.slow").write_text("#!/bin/sh\nsleep 30\n")

    rows = {
        "x.none": (127, "ENOENT: no tool 'x.none' on the CTX_PATH of agent 'coder' "),
        "x.mode": (126, "EACCES: step 2 (mode bits): tool/x.mode needs --x but mode 0750, "
                        f"owner 0:0 grants --- to uid {uid}"),
        "x.five": (126, "EACCES: step 5 (object policy): agent/coder.d/policy has no rule "
                        "'allow coder_t tool:x.five execute'"),
        "x.six": (126, "EACCES: step 6 (tool/model policy): tool/x.six.d/policy has no rule "),
        "x.hook": (126, "EACCES: hooks/pre.d/10-guard vetoed the call (exit 3): the guard "
                        "refuses"),
        "x.dmg": (126, f"ENOEXEC: tool x.dmg in {tool} is damaged: the schema control is not "
                       "JSON "),
        "x.big": (126, f"EFBIG: tool x.big in {tool} is damaged: x.big.d/cap holds more than "
                       "1048576 bytes, the limit of a control; "),
        "x.own": (126, "EACCES: step 6 (tool/model policy): tool/x.own is not host-owned: "
                       f"tool/x.own belongs to uid {uid}, the agent's own, "),
    }  # fmt: skip
    refusals = desk.batch([(("run", "--agent", "coder", name), "") for name in rows])
    for (status, message), refused in zip(rows.values(), refusals, strict=True):
        assert (refused.rc, refused.out) == (status, ""), refused
        assert refused.err.startswith(f"ctx: {message}"), refused
    slow = desk.ctx("run", "--agent", "coder", "--timeout", "1", "x.slow")
    assert slow.err == "ctx: ETIMEDOUT: timed out after 1s; its process group was killed\n"
    assert slow.rc == 137, slow  # the tool's status: killed by SIGKILL

    stages = {"x.none": ("resolve", None), "x.mode": ("authorize", 2),
              "x.five": ("authorize", 5), "x.hook": ("hook", None),
              "x.big": ("resolve", None)}  # fmt: skip
    natives = desk.batch([(("run", "--agent", "coder", "--native", name), "{}") for name in stages])
    for (name, (stage, step)), r in zip(stages.items(), natives, strict=True):
        frames = [json.loads(line) for line in r.lines()]
        assert r.rc == 1 and [f["type"] for f in frames] == ["result"], r
        error = frames[-1]["error"]
        assert (error["stage"], error["step"], frames[-1]["exit_status"]) == (stage, step, None)
        assert error["message"].startswith(rows[name][1].split(": ", 1)[1]), error


# ====================================================================== the core tools (R-5)


def test_the_core_tools_take_their_shorthands_and_refuse_paths_as_the_page_lists(
    desk: Desk,
) -> None:
    """R-5, T-2, T-3, T-5 ("The core tools"): the printed forms — a JSON object as the first
    argument, the main parameter alone, a command on stdin, ``fs.write PATH < FILE`` — work
    as an agent and run directly by a person; an empty stdin to ``fs.write``, a misspelt key
    (the page's ``'overwrit'`` sentence), ``..`` and a lone surrogate are ``EINVAL`` exit 2 with
    the file untouched; ``a.txt/`` is ``ENOTDIR``, a directory ``EISDIR``, a path under no mount
    ``EACCES``, a link ``ELOOP``, a visible read-only place ``EROFS`` and a hidden one
    ``EACCES``; each native output has the table's keys."""
    make_coder(desk)
    ws = desk.ws
    (ws / "sub").mkdir()
    (ws / "link").symlink_to("a.txt")
    assert desk.run("fs.read", '{"path":"a.txt"}').out == "data\n"
    assert desk.run("fs.read", "a.txt").out == "data\n"
    pwd_ = desk.run("shell.exec", input='{"cmd":"pwd"}')
    assert (pwd_.rc, pwd_.out) == (0, f"{ws}\n"), pwd_
    status = desk.run("shell.exec", "echo hi; exit 3")
    assert (status.rc, status.out) == (3, "hi\n"), status
    wrote = desk.run("fs.write", "b.txt", input="new text\n")
    assert wrote.rc == 0 and (ws / "b.txt").read_text() == "new text\n", wrote

    refusals = [
        (("fs.write", "b.txt"), "", 2, "fs.write: EINVAL: 'content' is required"),
        (("fs.write", '{"path": "b.txt", "content": "x", "overwrit": false}'), "", 2,
         "fs.write: EINVAL: 'overwrit' is not an input of fs.write (its inputs: 'path', "
         "'content', 'encoding', 'overwrite')"),
        (("fs.write", '{"path": "b.txt", "content": "x", "overwrite": false}'), "", 1,
         "fs.write: EEXIST: "),
        (("fs.write", '{"path": "new/", "content": "x"}'), "", 1, "fs.write: EISDIR: "),
        (("fs.read", "../ws/a.txt"), "", 2, "fs.read: EINVAL: "),
        (("fs.read", '{"path": "\\ud800"}'), "", 2, "fs.read: EINVAL: "),
        (("fs.read", "a.txt/"), "", 1, "fs.read: ENOTDIR: "),
        (("fs.read", "sub"), "", 1, "fs.read: EISDIR: "),
        (("fs.read", "/etc/hostname"), "", 1, "fs.read: EACCES: "),
        (("fs.read", "link"), "", 1, "fs.read: ELOOP: "),
        (("fs.write", '{"path": "/ctx/tool/fs.read.d/description", "content": "x"}'), "", 1,
         "fs.write: EROFS: "),
        (("fs.write", '{"path": "/ctx/agent/other", "content": "x"}'), "", 1,
         "fs.write: EACCES: "),
    ]  # fmt: skip
    runs = desk.batch(
        [(("run", "--agent", "coder", *argv), stdin) for argv, stdin, _, _ in refusals]
    )
    for (_, _, code, prefix), refused in zip(refusals, runs, strict=True):
        assert (refused.rc, refused.out) == (code, ""), refused
        assert refused.err.startswith(prefix), refused
    assert (ws / "b.txt").read_text() == "new text\n"
    assert not (ws / "new").exists()

    outputs = {
        "fs.read": ({"path": "a.txt"}, {"path", "size", "offset", "content", "encoding",
                                        "truncated"}),
        "fs.list": ({"path": "/workspace"}, {"path", "entries"}),
        "fs.stat": ({"path": "a.txt"}, {"path", "type", "size", "mode", "uid", "gid", "mtime"}),
        "fs.write": ({"path": "c.txt", "content": "c"}, {"path", "bytes", "created"}),
    }  # fmt: skip
    for name, (value, keys) in outputs.items():
        r, frames = desk.native(name, value)
        assert r.rc == 0 and set(frames[-1]["output"]) == keys, r
    listing = desk.native("fs.list", {"path": "/workspace"})[1][-1]["output"]["entries"]
    kinds = {e["name"]: e["type"] for e in listing}
    assert (kinds["a.txt"], kinds["sub"], kinds["link"]) == ("file", "directory", "symlink")
    assert all(set(e) == {"name", "type", "size"} for e in listing), listing

    # Run directly by a person: the host filesystem is one mount "/".
    person = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    fs_read = str(desk.root / "tool" / "fs.read")
    direct = subprocess.run([fs_read, json.dumps({"path": str(ws / "a.txt")})], env=person,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (direct.returncode, direct.stdout) == (0, "data\n"), direct
    native = subprocess.run([fs_read, f"{ws}/../ws/a.txt"], env={**person, "CTX_MODE": "native"},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert native.returncode == 2, native
    assert set(json.loads(native.stdout)) == {"error", "errno", "message"}, native
    assert native.stderr.startswith("fs.read: EINVAL: "), native


def test_a_tool_gets_exactly_the_documented_environment_in_both_modes(desk: Desk) -> None:
    """T-3, T-4, T-5 (docs/tools.md "Environment", "Terminal CLI mode"): the tool sees only
    ``PATH``, ``HOME``, ``LANG``, the ``CTX_*`` variables and, in terminal mode only, ``TERM``
    (the host's plain terminfo name, else ``xterm-256color``); ``CTX_PATH`` is what ``ctx agent
    show`` derives, ``CTX_CWD`` ``/workspace`` with the host directory behind it as the working
    directory, every word after TOOL is argv; an agent with one other mount starts there, one
    with none in its home."""
    make_coder(desk)
    user = nobody()
    desk.install(desk.manifest("env.dump", ENV_DUMP))
    desk.allow("env.dump")
    host_env = {**desk.env, "TERM": "screen-256color", "SECRET": "host value"}
    terminal = desk.ctx("run", "--agent", "coder", "env.dump", "--", "a", "--native", "--help",
                        env=host_env)  # fmt: skip
    assert terminal.rc == 0, terminal
    seen = terminal.json()
    common = {"PATH", "HOME", "LANG", "CTX_AGENT", "CTX_SESSION", "CTX_CALL", "CTX_TOOL",
              "CTX_MODE", "CTX_PATH", "CTX_MOUNTS", "CTX_CWD"}  # fmt: skip
    assert set(seen["env"]) == common | {"TERM"}, seen["env"]
    env = seen["env"]
    assert (env["PATH"], env["LANG"], env["TERM"], env["CTX_MODE"]) == (
        "/usr/local/bin:/usr/bin:/bin", "C.UTF-8", "screen-256color", "terminal")  # fmt: skip
    assert env["HOME"] in (user.pw_dir, "/"), env
    assert (env["CTX_AGENT"], env["CTX_TOOL"], env["CTX_SESSION"]) == ("coder", "env.dump",
                                                                       "default")  # fmt: skip
    assert (env["CTX_CWD"], seen["cwd"]) == ("/workspace", str(desk.ws)), seen
    assert seen["argv"] == ["--", "a", "--native", "--help"], seen
    shown = desk.ctx("agent", "show", "coder", "--json").json()
    assert env["CTX_PATH"] == shown["ctx_path"] == f"/ctx/tool:/ctx/home/{user.pw_uid}/tool"
    mounts = json.loads(env["CTX_MOUNTS"])
    assert mounts[0] == [str(desk.ws), "/workspace", "rw"], mounts
    assert [m[:3] for m in mounts if m[1] == "/ctx"] == [[str(desk.root), "/ctx", "ro"]]
    assert mounts == shown["tool_mounts"]

    odd = desk.ctx("run", "--agent", "coder", "env.dump", env={**desk.env, "TERM": "odd term"})
    assert odd.json()["env"]["TERM"] == "xterm-256color", odd
    r = desk.ctx("run", "--agent", "coder", "--native", "env.dump", input="{}", env=host_env)
    native = json.loads(r.lines()[-1])["output"]
    assert set(native["env"]) == common and native["env"]["CTX_MODE"] == "native", native
    assert native["env"]["CTX_CALL"] == json.loads(r.lines()[-1])["call"]

    # CTX_CWD without /workspace: the first other mount, else the agent's home.
    src = desk.top / "src"
    for name, mount in (("other", [[str(src), "/src", "ro"]]), ("bare", [])):
        request = {"name": name, "label": f"{name}_t", "tools": ["env.dump"], "mount": mount}
        made = desk.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made
        with (desk.root / "tool" / "env.dump.d" / "policy").open("a") as f:
            f.write(f"allow {name}_t tool:env.dump execute\n")
    where = desk.ctx("run", "--agent", "other", "env.dump").json()
    assert (where["env"]["CTX_CWD"], where["cwd"]) == ("/src", str(src)), where
    where = desk.ctx("run", "--agent", "bare", "env.dump").json()
    home = desk.root / "home" / str(user.pw_uid)
    assert (where["env"]["CTX_CWD"], where["cwd"]) == (f"/ctx/home/{user.pw_uid}", str(home))


# ====================================================================== ctx mount (F-1)


PROBE = r"""
import ctypes, errno, json, os, sys
m = sys.argv[1]
out = {}
def t(key, f):
    try:
        f(); out[key] = "ok"
    except OSError as e:
        out[key] = errno.errorcode[e.errno]
t("mkdir_root", lambda: os.mkdir(m + "/extra"))
t("create_root", lambda: open(m + "/extra.txt", "w").close())
t("rmdir_six", lambda: os.rmdir(m + "/model"))
t("rename_six", lambda: os.rename(m + "/model", m + "/home/model"))
t("mkfifo", lambda: os.mkfifo(m + "/home/fifo"))
t("mknod", lambda: os.mknod(m + "/home/null", 0o600 | 0o020000, os.makedev(1, 3)))
t("symlink", lambda: os.symlink("x", m + "/home/link"))
for name in ("a", "b"):
    open(f"{m}/home/{name}", "w").close()
libc = ctypes.CDLL(None, use_errno=True)
def ren(key, flags):
    r = libc.renameat2(-100, f"{m}/home/a".encode(), -100, f"{m}/home/b".encode(), flags)
    out[key] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
ren("whiteout", 4)
ren("noreplace", 1)
ren("exchange", 2)
os.umask(0o077)
open(m + "/home/umask.txt", "w").close()
os.mkdir(m + "/home/umask.d", 0o777)
out["nlink"] = {d: os.stat(f"{m}/{d}").st_nlink for d in ("", "tool", "home", "shared")}
out["listing"] = sorted(os.listdir(m))
print(json.dumps(out))
"""


@needs_fuse_as_root
def test_mount_and_umount_refuse_serve_and_unmount_as_mount_md_says(
    desk: Desk, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1, R-2, T-5 (docs/mount.md): ``ctx mount`` refuses a missing mount point with the
    ``mkdir`` that makes it, a file, a non-empty directory, one inside the storage root, a
    directory that is no storage root, a missing root, a mount point already served
    (``EBUSY``) and a root lying on a CortexFS mount — exit 1, nothing mounted.  Served, the
    root holds the six entries and no other is made (``EACCES``) nor one of them removed or
    renamed (``EPERM``, even by root); links and device nodes are ``ENOSYS``,
    ``RENAME_WHITEOUT`` ``EINVAL`` while ``RENAME_NOREPLACE``/``EXCHANGE`` pass; the caller's
    umask shapes what it makes; another uid reads by its own mode bits and may not unmount
    root's mount (``EPERM``); the host view counts links as on disk, an agent's view says 1.
    ``ctx umount`` exits 0, the mount process 0; on a plain directory ``EINVAL``, a missing
    path ``ENOENT``, another filesystem's mount ``EINVAL``."""
    points = desk.top / "points"
    points.mkdir()
    (points / "file").write_text("")
    (points / "full").mkdir()
    (points / "full" / "x").write_text("")
    inside = desk.root / "home" / "mp"
    inside.mkdir()
    (points / "plain").mkdir()
    (points / "notroot").mkdir()
    cases = [
        ((points / "nowhere",), "ENOENT", f"'mkdir {points / 'nowhere'}'"),
        ((points / "file",), "ENOTDIR", "not a directory"),
        ((points / "full",), "ENOTEMPTY", "not empty"),
        ((inside,), "EINVAL", "inside the storage root"),
        (("--storage", points / "notroot", points / "plain"), "EINVAL", "not a storage root"),
        (("--storage", points / "gone", points / "plain"), "ENOENT", "does not exist"),
    ]
    for args, code, words in cases:
        refused = desk.ctx("mount", *args, timeout=30)
        assert refused.rc == 1 and refused.err.startswith(f"ctx: {code}: "), refused
        assert words in refused.err, refused
        assert not mounted_at(Path(args[-1])), refused
    inside.rmdir()

    host = points / "host"
    host.mkdir()
    with serving(desk.root, host) as mount:
        again = desk.ctx("mount", host, timeout=30)
        assert again.rc == 1 and again.err.startswith(f"ctx: EBUSY: {host} is already"), again
        (points / "nested").mkdir()
        nested = desk.ctx("mount", "--storage", host, points / "nested", timeout=30)
        assert nested.rc == 1 and nested.err.startswith("ctx: EINVAL: "), nested
        assert "CortexFS mount" in nested.err and not mounted_at(points / "nested"), nested
        probe = subprocess.run([sys.executable, "-c", PROBE, str(host)], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        assert probe.returncode == 0, probe
        seen = json.loads(probe.stdout)
        assert seen["listing"] == sorted(ROOT_ENTRIES), seen
        assert (seen["mkdir_root"], seen["create_root"]) == ("EACCES", "EACCES"), seen
        assert (seen["rmdir_six"], seen["rename_six"]) == ("EPERM", "EPERM"), seen
        assert (seen["mkfifo"], seen["mknod"], seen["symlink"]) == ("ENOSYS",) * 3, seen
        assert (seen["whiteout"], seen["noreplace"], seen["exchange"]) == (
            "EINVAL", "EEXIST", "ok"), seen  # fmt: skip
        disk = desk.root / "home"
        assert stat.S_IMODE((disk / "umask.txt").stat().st_mode) == 0o600
        assert stat.S_IMODE((disk / "umask.d").stat().st_mode) == 0o700
        for name in ("", "tool", "home", "shared"):
            assert seen["nlink"][name] == (desk.root / name).stat().st_nlink, (name, seen)
        assert (desk.root / "model").is_dir() and not (desk.root / "extra").exists()

        busy = desk.ctx("umount", points / "plain")
        assert busy.rc == 1 and busy.err.startswith("ctx: EINVAL: "), busy
        missing = desk.ctx("umount", points / "nowhere")
        assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: "), missing
        # Served as root to every uid, with the kernel judging each caller's mode bits; only
        # root (who mounted it) may unmount it.
        other = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
        listed = run_as(unprivileged_user, ["ls", str(host)], env=other)
        assert sorted(listed.stdout.split()) == sorted(ROOT_ENTRIES), listed
        touched = run_as(unprivileged_user, ["touch", str(host / "home" / "x")], env=other)
        assert touched.returncode == 1 and "Permission denied" in touched.stderr, touched
        theirs = run_as(unprivileged_user, [*CTX_ARGV, "umount", str(host)], env=other)
        assert theirs.returncode == 1, theirs
        assert theirs.stderr.startswith(f"ctx: EPERM: cannot unmount {host}: "), theirs
        assert mounted_at(host)
        proc_fs = desk.ctx("umount", "/proc")
        assert proc_fs.rc == 1 and proc_fs.err.startswith("ctx: EINVAL: /proc is a proc mount")
        done = desk.ctx("umount", host, timeout=30)
        assert done.rc == 0, done
        assert mount.proc.wait(timeout=15) == 0, mount.said()
        assert not mounted_at(host)

    make_coder(desk)
    uid = nobody().pw_uid
    for home in ("0", str(uid)):
        (desk.root / "home" / home).mkdir(exist_ok=True)
    view = points / "view"
    view.mkdir()
    with serving(desk.root, view, "--as", "coder"):
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        for name in ("", "tool", "home", "agent", "shared"):
            assert (view / name).stat().st_nlink == 1, name
        assert sorted(os.listdir(view / "agent")) == ["coder", "coder.d"]
        assert os.listdir(view / "home") == [str(uid)]
