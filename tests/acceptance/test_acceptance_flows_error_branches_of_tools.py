"""The error branches of the tool lifecycle and of the runner, reached from outside through the
installed commands: ``ctx run`` (terminal and ``--native`` modes), ``ctx object
check|install|which|list``, ``ctx tool tsh.config``, ``ctx bootstrap``, the core tools' own
input checks, hand-edited controls and odd files left in a tier.

Sources: SPEC R-5, T-1, T-3, T-4, T-5, T-6, T-7, T-8, T-8a, H-3, H-4; docs/tools.md ("A tool
on disk", "Manifests, version 2", "How an install stays atomic", "Listing and resolving",
"CTX_PATH", "Running a tool", "The result", "Hooks", "The core tools", "ctx tool",
"ctx bootstrap"); the help of ``ctx object`` and ``ctx tool``.

The angle: each refusal the code can give for a tool is provoked as a user provokes it — a
commit marker or a lock file that is not what its name says, a program the kernel will not
start, an interpreter that is not there, a working directory removed, a core tool's launcher
written to, a control edited into something else, a core tool given input it must refuse —
and what is checked is the documented exit status, the errno word of the ``ctx: ERRNO: …``
line, of the native ``result`` frame or of the ``--json`` error, that the message names the
thing at fault and what to do, that the session and the tool's log say what was printed, and
that nothing is left half-done: no tool run that was refused, nothing installed by a refused
install, no hidden staging left behind, no command waiting for ever."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    age,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)

TOP = scratch_top(__file__)
LABEL = "coder_t"
# The tool every world holds: it leaves ``ran-t`` in the agent's working directory (the
# workspace), so that a refused call provably ran nothing.
T_PROGRAM = '#!/bin/sh\ntouch ran-t\necho "t $*"\n'
# A program the kernel refuses to start (no format it knows, and no ``#!`` line): were it
# handed to /bin/sh as a script, it would leave ``ran-binary`` behind.
BINARY = b"\x00\x01binary\ntouch ran-binary\necho ran as a shell script\n"
INPUT_LIMIT = 16777216  # docs/tools.md: what a core tool reads as its input


def manifest_of(name: str, program: str, **fields) -> dict:
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": program,
    }
    document.update(fields)
    return document


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root holding the space ``lab``, tool ``t`` (and those of
    :data:`INTERPRETED`) in the system tier, and agent ``coder`` (label ``coder_t``, running
    as ``nobody``) allowed them and ``fs.stat`` in both layers of P-6, whose workspace ``ws``
    is its first mount and its working directory."""

    top: Path
    storage: Path
    ws: Path
    manifests: Path
    uid: int = 0

    @property
    def env(self) -> dict[str, str]:
        """The root's, with ``CTX_PATH`` naming its system tier as a standalone human's
        default ``/ctx/tool`` does where ``/ctx`` is not mounted (T-4), whatever is mounted
        there on this host."""
        return clean_env(CTX_STORAGE=str(self.storage), CTX_PATH=str(self.storage / "tool"))

    def manifest(self, name: str, document: dict | bytes, program: bytes | None = None) -> Path:
        if program is not None:
            (self.manifests / f"{name}.prog").write_bytes(program)
        path = self.manifests / f"{name}.json"
        data = document if isinstance(document, bytes) else json.dumps(document).encode()
        path.write_bytes(data)
        return path

    def install(self, name: str, program: bytes, tier: str = "system") -> None:
        """``ctx object install`` of ``name`` running ``program``, allowed to coder (P-6)."""
        path = self.manifest(name, manifest_of(name, f"{name}.prog"), program)
        installed = self.ctx("object", "install", path, "--tier", tier)
        assert installed.rc == 0, installed
        directory = self.storage / "tool" if tier == "system" else self.tier_dir(tier)
        grant(directory / f"{name}.d" / "policy", name)
        grant(self.storage / "agent" / "coder.d" / "policy", name)

    def tier_dir(self, tier: str) -> Path:
        return self.storage / "shared" / tier.split(":", 1)[1] / "tool"

    def native(self, tool: str, data: str = "{}", **kw) -> Run:
        return self.ctx("run", "--agent", "coder", "--native", tool, input=data, **kw)

    def terminal(self, tool: str, *argv: str, **kw) -> Run:
        return self.ctx("run", "--agent", "coder", tool, *argv, **kw)

    def events(self) -> list[dict]:
        session = self.storage / "home" / str(self.uid) / "agent" / "coder" / "session"
        return read_jsonl(session / "default" / "events.jsonl")

    def last_result(self) -> dict:
        results = [e for e in self.events() if e["type"] == "tool_result"]
        assert results, self.events()
        return results[-1]

    def tool_dir(self, name: str) -> Path:
        return self.storage / "tool" / f"{name}.d"

    def ran(self, tag: str = "t") -> bool:
        return (self.ws / f"ran-{tag}").exists()

    def listed(self, name: str, tier: str = "system") -> dict:
        listing = self.ctx("object", "list", "--tier", tier, "--json")
        assert listing.rc == 0, listing
        (entry,) = [t for t in listing.json() if t["name"] == name]
        return entry


def grant(policy: Path, tool: str) -> None:
    with policy.open("a") as rules:
        rules.write(f"allow {LABEL} tool:{tool} execute\n")


# Tools whose ``#!`` line names an interpreter the kernel would refuse the agent: the name of
# the tool, what stands at the interpreter's path (made below the template's directory), the
# errno and the words of the refusal.
INTERPRETED = {
    "i.dir": ("a directory", "EACCES", "is not a regular file, which the kernel does not execute"),
    "i.chain": ("a script naming a missing interpreter", "ENOENT", "is not there"),
    "i.empty": ("an empty executable file", "ENOEXEC", "is no program: a text with no #! line"),
    "i.private": ("a script only root may execute", "EACCES", "has no execute bit for the tool's"),
}


def _interpreters(top: Path) -> dict[str, Path]:
    """The interpreters of :data:`INTERPRETED`, in a directory every uid may search."""
    where = top / "interpreters"
    where.mkdir(mode=0o755)
    where.chmod(0o755)
    made = {
        "i.dir": where / "adir",
        "i.chain": where / "chained",
        "i.empty": where / "empty",
        "i.private": where / "private",
    }
    made["i.dir"].mkdir(mode=0o755)
    made["i.chain"].write_text("#!/nonexistent/interpreter\n")
    made["i.chain"].chmod(0o755)
    made["i.empty"].write_text("")
    made["i.empty"].chmod(0o755)
    made["i.private"].write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    made["i.private"].chmod(0o700)
    return made


@pytest.fixture(scope="session")
def template() -> Iterator[World]:
    """Per test process: ``ctx bootstrap``, ``ctx shared create lab``, ``ctx agent create``
    and the installs once; each test works on a copy."""
    top = new_scratch_dir(TOP, "template-")
    ws = top / "ws"
    ws.mkdir()
    manifests = top / "m"
    manifests.mkdir()
    w = World(top, top / "storage", ws, manifests)
    made = ctx_run("bootstrap", "--storage", w.storage)
    assert made.rc == 0, made
    space = w.ctx("shared", "create", "lab")
    assert space.rc == 0, space
    agent = w.create_agent(
        {"name": "coder", "label": LABEL, "mount": [[str(ws), "/workspace", "rw"]]}
    )
    w.uid = agent["identity"]["uid"]
    w.install("t", T_PROGRAM.encode())
    for name, interpreter in _interpreters(top).items():
        w.install(name, f"#!{interpreter}\ntouch ran-{name}\n".encode())
    w.install("binary", BINARY)
    grant(w.tool_dir("fs.stat") / "policy", "fs.stat")
    grant(w.storage / "agent" / "coder.d" / "policy", "fs.stat")
    yield w
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: World) -> Iterator[World]:
    """A copy of the template's root, the agent's mounts pointed at a workspace of its own (as
    docs/policy.md says to do for a root copied elsewhere)."""
    top = new_scratch_dir(TOP, "w-")
    storage = copy_of_root(template.storage, top / "storage")
    ws = top / "ws"
    ws.mkdir()
    ws.chmod(0o777)
    manifests = top / "m"
    manifests.mkdir()
    mount = storage / "agent" / "coder.d" / "mount"
    mount.write_text(json.dumps([[str(ws), "/workspace", "rw"], [str(storage), "/ctx", "ro"]]))
    entry = storage / "agent" / "coder"
    entry.write_text(entry.read_text().replace(str(template.storage), str(storage)))
    yield World(top, storage, ws, manifests, template.uid)
    shutil.rmtree(top, ignore_errors=True)


def frames_of(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def refused_before_start(world: World, run: Run, errno_word: str, stage: str) -> dict:
    """A native call refused with ``errno_word`` at ``stage`` before its tool started: exit 1,
    a lone ``result`` frame (no ``call`` frame), no exit status, and its ``tool_call`` and
    ``tool_result`` last in the session saying the same; the error object is returned."""
    assert run.rc == 1, run
    frames = frames_of(run)
    assert [f["type"] for f in frames] == ["result"], run
    frame = frames[0]
    error = frame["error"]
    assert (frame["status"], frame["exit_status"], frame["output"]) == ("error", None, None)
    assert (error["error"], error["stage"]) == (errno_word, stage), frame
    calls = [e for e in world.events() if e["type"] in ("tool_call", "tool_result")]
    assert [e["type"] for e in calls[-2:]] == ["tool_call", "tool_result"], calls
    assert calls[-1]["call"] == calls[-2]["call"] == frame["call"], calls
    assert (calls[-1]["errno"], calls[-1]["stage"]) == (errno_word, stage), calls[-1]
    assert calls[-1]["exit_status"] is None, calls[-1]
    return error


def hidden(directory: Path) -> list[str]:
    """The hidden names of a tier, its lock file aside: staging, commit markers."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


# ================================================================ odd files in a tier


def test_a_commit_marker_left_standing_refuses_calls_until_bootstrap_settles_it(world):
    """docs/tools.md "How an install stays atomic", "Listing and resolving": a commit marker
    ``.t~commit`` an interrupted install left (cut short, a minute old) means the executable
    and the controls may be of two versions: every call meets ``EAGAIN`` at stage
    ``resolve`` (native exit 1, terminal exit 126), naming ``ctx bootstrap``, and runs
    nothing; ``ctx object list`` says ``unavailable`` with that reason; ``ctx bootstrap``
    removes the marker, says so, and the next call runs."""
    marker = world.storage / "tool" / ".t~commit"
    marker.write_text("5f3c0a1b")  # no line end: a marker cut short by a crash
    age(marker, 60)
    error = refused_before_start(world, world.native("t"), "EAGAIN", "resolve")
    assert "an install of it is in progress" in error["message"], error
    assert "'ctx bootstrap'" in error["message"], error
    terminal = world.terminal("t", "x")
    assert (terminal.rc, terminal.out) == (126, ""), terminal
    assert terminal.err == f"ctx: EAGAIN: {error['message']}\n", terminal
    entry = world.listed("t")
    assert (entry["status"], entry["reason"]) == ("unavailable", error["message"]), entry
    assert not world.ran()

    booted = world.ctx("bootstrap", "--json")
    assert booted.rc == 0, booted
    removed = (
        f"{world.storage}/tool/t: removed the unfinished commit marker of an interrupted install"
    )
    assert removed in booted.json()["repaired"], booted
    assert not os.path.lexists(marker)
    ran = world.terminal("t", "x")
    assert (ran.rc, ran.out) == (0, "t x\n"), ran
    assert world.ran()


def test_a_link_at_a_commit_marker_is_named_and_never_followed(world):
    """docs/tools.md "How an install stays atomic": the next install into the tier settles
    what interrupted installs left there before it makes anything.  A symbolic link at
    ``.t~commit`` is not read through: the install of another tool is refused (``ELOOP``,
    exit 1) naming ``.t~commit``, with nothing of it made; ``ctx bootstrap`` reports it as a
    problem naming it (exit 1) and leaves it, and the file it points to is untouched."""
    target = world.top / "elsewhere"
    target.write_text("0123456789ab 42\n")
    tier = world.storage / "tool"
    (tier / ".t~commit").symlink_to(target)
    manifest = world.manifest("u", manifest_of("u", "u.prog"), b"#!/bin/sh\n")
    before = snapshot(tier)
    refused = world.ctx("object", "install", manifest, "--tier", "system")
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err.startswith(f"ctx: ELOOP: cannot install {tier}/u: "), refused
    assert ".t~commit" in refused.err, refused
    assert snapshot(tier) == before
    booted = world.ctx("bootstrap", "--json")
    assert booted.rc == 1, booted
    assert [p for p in booted.json()["problems"] if ".t~commit" in p], booted
    assert os.readlink(tier / ".t~commit") == str(target)
    assert target.read_text() == "0123456789ab 42\n"


def test_a_directory_at_a_commit_marker_is_named_by_install_and_bootstrap(world):
    """docs/tools.md "How an install stays atomic", "ctx bootstrap" (a problem is reported
    naming what is in the way and left as it is): a directory someone made at ``.t~commit``
    is in the way of the next install into the tier and of bootstrap's repair of it.  Both
    refuse, and the message of each names ``.t~commit`` — the tier's own directory is not
    at fault; nothing is installed."""
    tier = world.storage / "tool"
    (tier / ".t~commit").mkdir()
    manifest = world.manifest("u", manifest_of("u", "u.prog"), b"#!/bin/sh\n")
    before = snapshot(tier)
    refused = world.ctx("object", "install", manifest, "--tier", "system")
    assert (refused.rc, refused.out) == (1, ""), refused
    assert snapshot(tier) == before
    assert refused.err.startswith("ctx: EISDIR: "), refused
    booted = world.ctx("bootstrap", "--json")
    assert booted.rc == 1, booted
    assert ".t~commit" in refused.err, refused
    assert [p for p in booted.json()["problems"] if ".t~commit" in p], booted


def test_a_fifo_at_a_commit_marker_is_never_waited_on(world):
    """docs/tools.md ("never waiting on a FIFO", "ctx bootstrap": a problem is reported and
    left as it was): a FIFO at ``.u~commit`` in space ``lab``'s tier and at ``.t~commit`` in
    the system tier.  An install into ``lab`` and ``ctx bootstrap`` each end within seconds
    (refused or reporting a problem, naming the marker) rather than wait for a writer that
    never comes; nothing is installed."""
    lab = world.tier_dir("shared:lab")
    os.mkfifo(lab / ".u~commit")
    os.mkfifo(world.storage / "tool" / ".t~commit")
    manifest = world.manifest("u", manifest_of("u", "u.prog"), b"#!/bin/sh\n")
    commands = {
        "install": ["object", "install", str(manifest), "--tier", "shared:lab"],
        "bootstrap": ["bootstrap", "--json"],
    }
    started = {
        what: subprocess.Popen(
            [*CTX_ARGV, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=world.env,
            start_new_session=True,
        )
        for what, argv in commands.items()
    }
    deadline = time.monotonic() + 8
    try:
        ended = {}
        for what, proc in started.items():
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                continue
            ended[what] = (proc.returncode, out.decode(), err.decode())
    finally:
        for proc in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert sorted(ended) == ["bootstrap", "install"], ended
    rc, out, err = ended["install"]
    assert (rc, out) == (1, ""), ended
    assert ".u~commit" in err, ended
    assert not (lab / "u").exists()
    rc, out, _ = ended["bootstrap"]
    assert rc == 1 and [p for p in json.loads(out)["problems"] if ".t~commit" in p], ended


def test_staging_an_interrupted_install_left_is_removed_without_following_what_it_holds(world):
    """docs/tools.md "How an install stays atomic": staging without a commit marker is
    discarded by the next install into the tier.  A staged control directory holding a FIFO
    and a symbolic link to a file outside the root, and a staged entry that is a symbolic
    link, are removed as they are — never opened, never followed: the files they point to
    are left whole — and the install succeeds, leaving only the tier's lock file hidden."""
    tier = world.storage / "tool"
    outside = world.top / "precious"
    outside.write_text("keep me\n")
    staged = tier / ".t~0123456789ab~controls"
    staged.mkdir()
    os.mkfifo(staged / "schema")
    (staged / "policy").symlink_to(outside)
    (tier / ".t~0123456789ab~entry-tmp").symlink_to(outside)
    manifest = world.manifest("u", manifest_of("u", "u.prog"), b"#!/bin/sh\necho u\n")
    installed = world.ctx("object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed
    assert installed.out == f"installed u in tier system: {tier}/u\n", installed
    assert hidden(tier) == [], hidden(tier)
    assert outside.read_text() == "keep me\n"
    ran = world.terminal("t", "still")
    assert (ran.rc, ran.out) == (0, "t still\n"), ran


def test_a_directory_at_the_tiers_lock_file_refuses_installs_and_updates_naming_it(world):
    """docs/tools.md "How an install stays atomic", "tsh.config": installs and ``tsh.config``
    updates of a tier take turns under the regular file ``.install-lock``.  A directory put
    at that name is not a lock: the install is refused (``EISDIR``, exit 1) naming it and
    saying to move it away, with nothing staged or installed; an update of ``tsh.d/config``
    is refused (exit 1) naming it, the file byte for byte as it was; a read still works."""
    tier = world.storage / "tool"
    (tier / ".install-lock").unlink()
    (tier / ".install-lock").mkdir()
    manifest = world.manifest("u", manifest_of("u", "u.prog"), b"#!/bin/sh\n")
    before = snapshot(tier)
    refused = world.ctx("object", "install", manifest, "--tier", "system")
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err.startswith(f"ctx: EISDIR: cannot install {tier}/u: "), refused
    assert f"{tier}/.install-lock is a directory" in refused.err, refused
    assert "move it away" in refused.err, refused
    assert snapshot(tier) == before
    config = tier / "tsh.d" / "config"
    update = world.ctx("tool", "tsh.config", "cache_capacity=40")
    assert (update.rc, update.out) == (1, ""), update
    assert f"{tier}/.install-lock is no regular file" in update.err, update
    assert "move it away" in update.err, update
    logged = read_jsonl(world.tool_dir("tsh.config") / "log")
    assert [(e["argv"], e["exit_status"]) for e in logged] == [(["cache_capacity=40"], 1)]
    assert {k: v for k, v in snapshot(tier).items() if k != "tsh.config.d/log"} == {
        k: v for k, v in before.items() if k != "tsh.config.d/log"
    }
    read = world.ctx("tool", "tsh.config")
    assert read.rc == 0 and "cache_capacity=32\n" in read.out, read
    assert config.read_bytes() == before["tsh.d/config"][1]


# ================================================================ ctx object check, which


def _manifest_bytes(name: str, **fields) -> bytes:
    return json.dumps(manifest_of(name, "p.sh", **fields)).encode()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param(
            _manifest_bytes("v").replace(b'"The v tool."', b'"caf\xe9"'),
            "not UTF-8, as JSON is: invalid continuation byte at byte ",
            id="a-manifest-that-is-not-UTF-8",
        ),
        pytest.param(
            _manifest_bytes("v", exec="."),
            "exec: {m} is not a regular file (a FIFO, device or directory)",
            id="exec-the-manifests-own-directory",
        ),
        pytest.param(
            _manifest_bytes("v", exec="p.sh/x"),
            "exec: {m}/p.sh/x: Not a directory",
            id="exec-through-a-file",
        ),
        pytest.param(
            _manifest_bytes("v", exec="p\u0000.sh"),
            "exec: holds a NUL character, which no path can hold",
            id="exec-holding-a-NUL",
        ),
        pytest.param(
            json.dumps(
                {
                    **{k: v for k, v in manifest_of("x.d.y", "p.sh").items() if k != "exec"},
                    "mcp": {
                        "transport": "stdio",
                        "config": "/srv/mcp/mcp.json",
                        "server": "x.d",
                        "tool": "y",
                    },
                }
            ).encode(),
            "mcp/server: 'x.d' ends in '.d'",
            id="mcp-server-ending-in-.d",
        ),
    ],
)
def test_a_manifest_refused_by_check_names_its_field_and_install_makes_nothing(
    world, data, fragment
):
    """T-8, docs/tools.md "Manifests, version 2", "How the manifest and its program are
    read": ``ctx object check`` lists the problem on its own line ``MANIFEST: EINVAL: …``
    (exit 1, nothing on stdout), ``--json`` gives it with code ``EINVAL`` and ``valid``
    false, and ``ctx object install`` of the same manifest is refused (exit 1) with the tier
    unchanged."""
    (world.manifests / "p.sh").write_text("#!/bin/sh\n")
    manifest = world.manifest("v", data)
    said = fragment.format(m=world.manifests)
    checked = world.ctx("object", "check", manifest)
    assert (checked.rc, checked.out) == (1, ""), checked
    assert f"{manifest}: EINVAL: {said}" in checked.err.splitlines()[0], checked
    as_json = world.ctx("object", "check", "--json", manifest)
    assert as_json.rc == 1, as_json
    [entry] = as_json.json()
    assert (entry["valid"], entry["name"], entry["error"]) == (False, None, None), entry
    assert entry["codes"] == ["EINVAL"] * len(entry["problems"]), entry
    assert any(said in p for p in entry["problems"]), entry
    tier = world.storage / "tool"
    before = snapshot(tier)
    refused = world.ctx("object", "install", manifest, "--tier", "system")
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err.startswith(f"ctx: EINVAL: {manifest}: "), refused
    assert snapshot(tier) == before


def test_a_manifest_below_a_file_is_one_line_with_its_own_errno(world):
    """docs/tools.md: "A manifest that cannot be read at all is one line with its own errno":
    ``FILE/m.json`` where ``FILE`` is a regular file is ``ENOTDIR`` (exit 1), in the text
    line as in ``--json``'s ``error`` object, with no problems listed; install says the
    same and nothing is installed."""
    (world.manifests / "file").write_text("not a directory\n")
    manifest = world.manifests / "file" / "m.json"
    checked = world.ctx("object", "check", manifest)
    assert (checked.rc, checked.out) == (1, ""), checked
    assert checked.err == (
        f"{manifest}: ENOTDIR: cannot read {manifest}: Not a directory; nothing was checked "
        "or installed\n"
    ), checked
    [entry] = world.ctx("object", "check", "--json", manifest).json()
    assert (entry["valid"], entry["problems"], entry["codes"]) == (False, [], []), entry
    assert (entry["error"]["error"], entry["error"]["errno"]) == ("ENOTDIR", 20), entry
    before = snapshot(world.storage / "tool")
    refused = world.ctx("object", "install", manifest, "--tier", "system", "--json")
    assert refused.rc == 1, refused
    assert refused.json()["error"] == "ENOTDIR", refused
    assert snapshot(world.storage / "tool") == before


def test_which_passes_over_a_path_entry_it_cannot_look_into_saying_why(world):
    """T-4, T-8a, docs/tools.md "CTX_PATH": a ``CTX_PATH`` entry that is a loop of symbolic
    links cannot be looked into; the search passes over it and goes on to the next entry
    (exit 0), ``--json``'s ``skipped`` naming it with the kernel's reason.  With nothing
    after it, ``which`` is ``ENOENT`` (exit 1) naming the path and what it passed over."""
    loop = world.top / "loop"
    loop.symlink_to(loop)
    bin_dir = world.top / "bin"
    bin_dir.mkdir()
    (bin_dir / "zz").write_text("#!/bin/sh\n")
    (bin_dir / "zz").chmod(0o755)
    passed_over = f"{loop}/zz: Too many levels of symbolic links"
    env = {**world.env, "CTX_PATH": f"{loop}:{bin_dir}"}
    found = world.ctx("object", "which", "--json", "zz", env=env)
    assert found.rc == 0, found
    answer = found.json()
    assert (answer["path"], answer["skipped"]) == (str(bin_dir / "zz"), [passed_over]), answer
    alone = world.ctx("object", "which", "zz", env={**world.env, "CTX_PATH": str(loop)})
    assert (alone.rc, alone.out) == (1, ""), alone
    assert alone.err == (
        f"ctx: ENOENT: zz is not on CTX_PATH ({loop}); passed over: {passed_over}\n"
    ), alone


# ================================================================ the runner's stages


@pytest.mark.parametrize("tool", sorted(INTERPRETED))
def test_an_interpreter_the_kernel_would_refuse_is_named_at_stage_run(world, tool):
    """T-5, docs/tools.md stage ``run``: a script whose ``#!`` interpreter the kernel would
    refuse the agent — a directory, a script naming an interpreter that is not there, an
    empty file, one whose execute bits are not the agent's — is refused before it starts,
    with that errno and a message naming the interpreter and what is wrong with it; the
    result has no exit status (never the 126 or 127 of a tool that ran), ``ctx run`` exits
    1 in native mode and 126 in terminal mode, and nothing ran."""
    what, errno_word, words = INTERPRETED[tool]
    error = refused_before_start(world, world.native(tool), errno_word, "run")
    message = error["message"]
    assert message.startswith(f"cannot start {world.storage}/tool/{tool}: its interpreter "), error
    assert words in message, (what, error)
    terminal = world.terminal(tool)
    assert (terminal.rc, terminal.out) == (126, ""), terminal
    assert terminal.err == f"ctx: {errno_word}: {message}\n", terminal
    assert world.last_result()["errno"] == errno_word
    assert not world.ran(tool)


def test_a_program_the_kernel_will_not_start_is_never_run_as_a_shell_script(world):
    """T-5, docs/tools.md stage ``run`` (``ENOEXEC`` … "with which setpriv's execvp would
    otherwise have run the tool with ``/bin/sh``"): a program file that holds a NUL and is
    in no format the kernel knows — a binary cut short — cannot start.  The call is refused
    at stage ``run`` with ``ENOEXEC`` (terminal exit 126), and none of its bytes run as shell
    commands: its ``touch ran-binary`` line leaves nothing."""
    terminal = world.terminal("binary")
    assert not world.ran("binary"), terminal
    assert (terminal.rc, terminal.out) == (126, ""), terminal
    assert terminal.err.startswith("ctx: ENOEXEC: cannot start "), terminal
    error = refused_before_start(world, world.native("binary"), "ENOEXEC", "run")
    assert str(world.storage / "tool" / "binary") in error["message"], error


@pytest.mark.parametrize("shape", ["missing", "a-file"])
def test_a_working_directory_that_is_gone_is_named_with_the_mount_to_fix(world, shape):
    """docs/tools.md "Environment" (the process's working directory is the host directory
    behind ``CTX_CWD``), stage ``run``: the agent's workspace, its first mount, removed (or
    replaced by a file) is refused before the tool starts — ``ENOENT`` (``ENOTDIR``) naming
    the directory and ``agent/coder.d/mount`` to fix — native exit 1, terminal exit 126,
    recorded in the session; nothing ran."""
    shutil.rmtree(world.ws)
    if shape == "a-file":
        world.ws.write_text("")
    errno_word, state = ("ENOENT", "does not exist") if shape == "missing" else (
        "ENOTDIR", "is not a directory"
    )  # fmt: skip
    error = refused_before_start(world, world.native("t"), errno_word, "run")
    assert error["message"] == (
        f"agent coder's working directory {world.ws} {state}; fix the mount at /workspace "
        "in agent/coder.d/mount"
    ), error
    terminal = world.terminal("t")
    assert (terminal.rc, terminal.out) == (126, ""), terminal
    assert terminal.err == f"ctx: {errno_word}: {error['message']}\n", terminal


def test_a_working_directory_that_is_gone_is_not_blamed_on_an_intact_pre_hook(world):
    """T-6, docs/tools.md "Hooks" (a pre-hook vetoes by its exit; the veto names the hook
    and quotes it) and stage ``run``: a guard that would pass every call cannot start only
    because the call's working directory is gone.  That is no verdict of the guard's: the
    call is refused as it is without the hook, ``ENOENT`` naming the working directory and
    the mount to fix (terminal exit 126)."""
    guard = world.tool_dir("t") / "hooks" / "pre.d" / "10-guard"
    guard.write_text("#!/bin/sh\nexit 0\n")
    guard.chmod(0o755)
    shutil.rmtree(world.ws)
    terminal = world.terminal("t")
    assert (terminal.rc, terminal.out) == (126, ""), terminal
    assert terminal.err.startswith(
        f"ctx: ENOENT: agent coder's working directory {world.ws} does not exist"
    ), terminal


def test_a_hook_whose_interpreter_is_not_there_is_a_veto_naming_it_or_a_failed_post_hook(world):
    """T-6, docs/tools.md "Hooks": a pre-hook whose ``#!`` interpreter is not there cannot
    run, and a guard that cannot run vetoes: ``EACCES`` (terminal exit 126) naming the hook,
    exit 126 and the interpreter; the tool never runs.  The same file as a post-hook is a
    failed hook listed in ``post_hooks`` (exit 126, the same words) of a call that is ``ok``,
    in the ``result`` frame and in the tool's log line."""
    hooks = world.tool_dir("t") / "hooks"
    guard = hooks / "pre.d" / "10-guard"
    guard.write_text("#!/nonexistent/sh\nexit 0\n")
    guard.chmod(0o755)
    why = (
        "cannot be run: its interpreter /nonexistent/sh, named on its #! line, is not there "
        "(No such file or directory)"
    )
    vetoed = world.terminal("t", "x")
    assert (vetoed.rc, vetoed.out) == (126, ""), vetoed
    assert vetoed.err == (
        f"ctx: EACCES: hooks/pre.d/10-guard vetoed the call (exit 126): {why}\n"
    ), vetoed
    assert not world.ran()
    guard.rename(hooks / "post.d" / "10-audit")
    run = world.native("t")
    assert run.rc == 0, run
    result = frames_of(run)[-1]
    failed = [{"hook": "hooks/post.d/10-audit", "exit_status": 126, "message": why}]
    assert (result["status"], result["post_hooks"]) == ("ok", failed), result
    logged = read_jsonl(world.tool_dir("t") / "log")[-1]
    assert (logged["call"], logged["post_hooks"]) == (result["call"], failed), logged


def test_a_pre_hook_the_kernel_will_not_start_vetoes_the_call(world):
    """T-6, docs/tools.md "Hooks" ("a guard that cannot run must not let calls through"): a
    pre-hook whose file the kernel cannot start (a NUL, no ``#!`` line, no binary format)
    vetoes the call: ``EACCES`` (exit 126) naming the hook; the tool never runs."""
    guard = world.tool_dir("t") / "hooks" / "pre.d" / "10-guard"
    guard.write_bytes(b"\x00guard cut short\nexit 0\n")
    guard.chmod(0o755)
    vetoed = world.terminal("t", "x")
    assert not world.ran(), vetoed
    assert (vetoed.rc, vetoed.out) == (126, ""), vetoed
    assert vetoed.err.startswith("ctx: EACCES: hooks/pre.d/10-guard vetoed the call"), vetoed


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        pytest.param(
            {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
            "schema refers to itself without end: '#/properties/a' leads back to itself",
            id="a-reference-cycle-below-the-top",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}}},
            "schema refers to '#/$defs/gone', which it does not hold",
            id="a-reference-to-nothing",
        ),
        pytest.param(False, "schema must be a JSON Schema object, not a boolean", id="false"),
    ],
)
def test_a_schema_control_edited_into_what_no_input_can_be_checked_by_is_damage(
    world, schema, reason
):
    """T-1, T-8 (``schema``: an object, a valid JSON Schema), docs/tools.md "A tool on disk":
    a ``schema`` control edited by hand into one no input can be judged by — a reference
    cycle below the top, a reference to a place it does not hold, ``false`` — makes the
    tool damaged: ``ENOEXEC`` at stage ``resolve`` (native exit 1, terminal 126) with the
    reason and the reinstall that mends it; ``ctx object list`` says ``damaged`` with the
    same problem; nothing runs."""
    (world.tool_dir("t") / "schema").write_text(json.dumps(schema))
    error = refused_before_start(world, world.native("t", '{"a": 1}'), "ENOEXEC", "resolve")
    assert error["message"].startswith(f"tool t in {world.storage}/tool is damaged: {reason}")
    assert "'ctx object install MANIFEST --tier system'" in error["message"], error
    terminal = world.terminal("t")
    assert (terminal.rc, terminal.err) == (126, f"ctx: ENOEXEC: {error['message']}\n"), terminal
    entry = world.listed("t")
    assert entry["status"] == "damaged" and entry["problems"][0].startswith(reason), entry
    assert not world.ran()


def test_a_core_launcher_written_to_is_refused_naming_bootstrap_which_repairs_it(world):
    """docs/tools.md stage ``resolve``, "Errors you will see", "The core tools": a byte
    appended to ``tool/fs.stat`` (its launcher) makes it not the size bootstrap wrote: the
    call is refused before it runs, ``EINVAL`` naming the tool, the root and ``ctx
    bootstrap`` (terminal exit 126, native exit 1); ``ctx bootstrap`` reinstalls it
    (``repaired``, exit 0) keeping its policy, and the next call works."""
    launcher = world.storage / "tool" / "fs.stat"
    policy = (world.tool_dir("fs.stat") / "policy").read_bytes()
    with launcher.open("ab") as written:
        written.write(b"x")
    (world.ws / "a.txt").write_text("data\n")
    said = (
        f"core tool fs.stat in {world.storage} is damaged: not the size bootstrap wrote (cut "
        "short, or appended to), and bootstrap reinstalls it: run 'ctx bootstrap' (the tool did "
        "not run)"
    )
    terminal = world.terminal("fs.stat", "a.txt")
    assert (terminal.rc, terminal.out, terminal.err) == (126, "", f"ctx: EINVAL: {said}\n")
    error = refused_before_start(
        world, world.native("fs.stat", '{"path": "a.txt"}'), "EINVAL", "resolve"
    )
    assert error["message"] == said, error
    booted = world.ctx("bootstrap", "--json")
    assert booted.rc == 0 and "tool/fs.stat" in booted.json()["repaired"], booted
    assert (world.tool_dir("fs.stat") / "policy").read_bytes() == policy
    stat = world.terminal("fs.stat", "a.txt")
    assert stat.rc == 0 and "path: /workspace/a.txt\n" in stat.out, stat


# ================================================================ the core tools' own input


@pytest.mark.parametrize(
    ("argv", "stdin", "said"),
    [
        pytest.param(
            ['{"path": "a.txt"}', "more"], b"", "expected one JSON object", id="json-then-more"
        ),
        pytest.param(
            ["a.txt", "b.txt"],
            b"",
            "expected one argument (a JSON object or a value)",
            id="two-shorthand-arguments",
        ),
        pytest.param(
            ['{"path": 5'], b"", "input is not JSON: Expecting ", id="an-argument-not-JSON"
        ),
        pytest.param(
            [], b"\xff\xfe{}", "input is not UTF-8 text (byte 0 is not)", id="stdin-not-UTF-8"
        ),
        pytest.param([], b"[1, 2]", "input must be a JSON object", id="stdin-an-array"),
        pytest.param(
            [],
            b'{"path": "a.txt", "path": "b.txt"}',
            "the input gives the name 'path' twice in one object",
            id="stdin-a-name-twice",
        ),
        pytest.param(
            [],
            b'{"path": "\\ud800"}',
            "the input holds '\\ud800', a lone surrogate, which is not a character",
            id="stdin-a-lone-surrogate",
        ),
    ],
)
def test_core_tool_input_it_cannot_take_is_einval_exit_2_and_nothing_is_done(
    world, argv, stdin, said
):
    """docs/tools.md "The core tools": input is one JSON object, the first argument or
    stdin; one argument that is not one is the shorthand.  Anything else — more words after
    the object or the shorthand, an argument that starts as JSON and is not, stdin that is
    not UTF-8, not an object, names a key twice or holds a lone surrogate — is bad input:
    ``fs.stat: EINVAL: …`` on stderr, exit 2 through ``ctx run`` in terminal mode, nothing
    on stdout, and the session's ``tool_result`` records exit status 2."""
    (world.ws / "a.txt").write_text("data\n")
    refused = world.terminal("fs.stat", *argv, input=stdin)
    assert (refused.rc, refused.out) == (2, ""), refused
    assert refused.err.startswith(f"fs.stat: EINVAL: {said}"), refused
    assert len(refused.err.splitlines()) == 1, refused
    result = world.last_result()
    assert (result["object"], result["exit_status"], result["stage"]) == (
        "tool/fs.stat",
        2,
        "exit",
    ), result


def test_core_tool_stdin_past_16_mib_is_efbig_exit_1(world):
    """docs/tools.md "The core tools", "Agent native mode": a core tool reads at most 16 MiB
    (16777216 bytes) of input.  Piped more than that in terminal mode, ``fs.stat`` says
    ``fs.stat: EFBIG: input is larger than 16777216 bytes`` and exits 1 — too much input
    is a refusal, not a malformed one — and the session records that exit status."""
    data = b'{"path": "' + b"a" * INPUT_LIMIT + b'"}'
    refused = world.terminal("fs.stat", input=data, timeout=120)
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err == f"fs.stat: EFBIG: input is larger than {INPUT_LIMIT} bytes\n", refused
    assert world.last_result()["exit_status"] == 1


# ================================================================ ctx tool tsh.config


@pytest.mark.parametrize(
    ("shape", "errno_word", "said"),
    [
        pytest.param("link", "ELOOP", ": Too many levels of symbolic links", id="a-symlink"),
        pytest.param("directory", "EINVAL", " is not a regular file", id="a-directory"),
        pytest.param("fifo", "EINVAL", " is not a regular file", id="a-FIFO-never-waited-on"),
    ],
)
def test_a_tsh_config_that_is_no_regular_file_is_refused_by_tsh_config(
    world, shape, errno_word, said
):
    """H-4, H-3, docs/tools.md ("tool/tsh.d/config is data"; "ctx bootstrap": a link, FIFO,
    socket or device where it writes a file "holds nobody's data and every reader refuses
    it"): ``ctx tool tsh.config`` refuses to read or update a config that is a symbolic link,
    a directory or a FIFO — ``ctx: ERRNO: tsh.config: <path>…`` naming it, exit 1, never
    waiting on the FIFO — the thing there left as it was, the file a link points to
    untouched, and each call a line of the tool's log with that exit status."""
    tsh_d = world.storage / "tool" / "tsh.d"
    config = tsh_d / "config"
    original = config.read_bytes()
    config.unlink()
    target = world.top / "config.elsewhere"
    if shape == "link":
        target.write_bytes(original)
        config.symlink_to(target)
    elif shape == "directory":
        config.mkdir()
    else:
        os.mkfifo(config)
    before = snapshot(tsh_d)
    for argv in ((), ("cache_capacity=40",)):
        refused = world.ctx("tool", "tsh.config", *argv, timeout=20)
        assert (refused.rc, refused.out) == (1, ""), refused
        assert refused.err == f"ctx: {errno_word}: tsh.config: {config}{said}\n", refused
        logged = read_jsonl(world.tool_dir("tsh.config") / "log")[-1]
        assert (logged["argv"], logged["exit_status"], logged["mode"]) == (
            list(argv),
            1,
            "host",
        ), logged
    assert snapshot(tsh_d) == before
    if shape == "link":
        assert target.read_bytes() == original


def test_tsh_config_without_the_tiers_lock_file_reads_but_updates_only_after_bootstrap(world):
    """H-4, docs/tools.md "tsh.config", "How an install stays atomic": updates take turns
    under ``tool/.install-lock``.  With the lock file gone a read still shows the settings,
    and an update is refused (``ENOENT``, exit 1) naming the lock file and ``ctx bootstrap``,
    the config byte for byte as it was and no lock file made by the refusal; ``ctx
    bootstrap`` makes it (exit 0), and the same update then works."""
    tier = world.storage / "tool"
    (tier / ".install-lock").unlink()
    config = tier / "tsh.d" / "config"
    original = config.read_bytes()
    read = world.ctx("tool", "tsh.config")
    assert read.rc == 0 and "cache_capacity=32\n" in read.out, read
    refused = world.ctx("tool", "tsh.config", "cache_capacity=40")
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err == (
        f"ctx: ENOENT: tsh.config: {tier}/.install-lock, the lock that updates of {config} "
        "take turns under, is missing; 'ctx bootstrap' makes it\n"
    ), refused
    assert config.read_bytes() == original
    assert not (tier / ".install-lock").exists()
    booted = world.ctx("bootstrap")
    assert booted.rc == 0, booted
    assert (tier / ".install-lock").is_file()
    updated = world.ctx("tool", "tsh.config", "cache_capacity=40")
    assert updated.rc == 0 and "cache_capacity=40\n" in updated.out, updated
    assert b"cache_capacity=40\n" in config.read_bytes()


def test_tsh_config_without_tsh_d_names_it_and_bootstrap_makes_it_again(world):
    """H-4, R-5, docs/tools.md "tsh.config": ``tool/tsh.d/`` (tsh's control directory, which
    holds the config) removed: ``ctx tool tsh.config`` — a read or an update — is ``ENOENT``
    (exit 1) naming ``tsh.d`` and ``ctx bootstrap``, and makes nothing; ``ctx bootstrap``
    repairs tsh and creates the config with the defaults of H-4, which a read then shows."""
    tsh_d = world.storage / "tool" / "tsh.d"
    shutil.rmtree(tsh_d)
    for argv in ((), ("cache_capacity=40",)):
        refused = world.ctx("tool", "tsh.config", *argv)
        assert (refused.rc, refused.out) == (1, ""), refused
        assert refused.err == (
            f"ctx: ENOENT: tsh.config: {tsh_d} does not exist; ctx bootstrap creates it\n"
        ), refused
        assert not tsh_d.exists()
    booted = world.ctx("bootstrap", "--json")
    assert booted.rc == 0, booted
    assert "tool/tsh.d/config" in booted.json()["created"], booted
    read = world.ctx("tool", "tsh.config")
    assert read.rc == 0, read
    assert read.out == "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n", read


def test_ctx_tool_names_a_tsh_config_earlier_on_ctx_path_as_not_the_core_tool(world):
    """H-3, docs/tools.md "ctx tool": NAME must resolve on the caller's ``CTX_PATH`` to the
    core tool of the storage root's ``tool/``; a ``tsh.config`` of another directory earlier
    on the path is refused (``EACCES``, exit 1) naming both paths, and never run: the
    config stays as it was."""
    other = world.top / "other"
    other.mkdir()
    (other / "tsh.config").write_text("#!/bin/sh\ntouch ran-other\n")
    (other / "tsh.config").chmod(0o755)
    config = world.storage / "tool" / "tsh.d" / "config"
    original = config.read_bytes()
    env = {**world.env, "CTX_PATH": f"{other}:{world.storage}/tool"}
    refused = world.ctx("tool", "tsh.config", "cache_capacity=40", env=env, cwd=world.ws)
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err == (
        f"ctx: EACCES: tsh.config on CTX_PATH is {other}/tsh.config, not the core tool "
        f"{world.storage}/tool/tsh.config; ctx tool runs only the core CLIs\n"
    ), refused
    assert config.read_bytes() == original
    assert not (world.ws / "ran-other").exists()
    direct = world.ctx("tool", "tsh.config")
    assert direct.rc == 0 and direct.out.startswith("max_loaded_tools=64\n"), direct
