"""Every documented refusal of tools, manifests, objects, ``CTX_PATH``, the runner, policy
v0, sessions and events is reachable as a user would reach it, with the documented errno,
exit status and stage or chain step, and with nothing half-done.

Sources: SPEC §4 (S-1, S-2, S-5, S-6), §5 (P-2, P-3, P-4, P-5, P-6, P-8), §6 (T-1, T-3, T-4,
T-6, T-7, T-8, T-8a), §7 (H-3, H-4); docs/tools.md ("A tool on disk", "Manifests, version
2", "How the manifest and its program are read", "How an install stays atomic", "Listing and
resolving", "CTX_PATH", "Running a tool", "Agent native mode and its frames", "The result",
"Hooks", "ctx tool", "For workers and other callers"), docs/policy.md ("What the chain
reads", "Commands", "Errors you will see"), docs/sessions.md ("Commands", "Appending,
crash-safely", "For workers and other callers"), and the help of ``ctx run``, ``ctx
object``, ``ctx policy``, ``ctx session`` and ``ctx tool``.

The angle: for each sentence that says an input or a situation is refused (``EINVAL``,
``EEXIST``, ``ENOENT``, ``EACCES`` with its step, ``EFBIG``, ``ELOOP``, ``ENOEXEC``,
``ETIMEDOUT``, ``EBADF``, ``EPERM``…) or gives an exit status, the situation is provoked as a
user would provoke it, and the errno word (in the message, the ``--json`` error object or
the native ``result`` frame), the exit status, the stage or step named, and what is left
behind (the storage root unchanged, no event recorded where none is to be, the tool never
started) are checked.  Parametrized ids name the sentence checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.storage import attribute, copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
PYTHON = str(REPO / ".venv" / "bin" / "python")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)

CONTROL_LIMIT = 1048576  # docs/tools.md: any control but a policy
POLICY_LIMIT = 16777216  # docs/policy.md: a policy, and a FILE of ctx policy check
INPUT_LIMIT = 16777216  # docs/tools.md: a native input
YEAR_AND_A_DAY = 31622400  # docs/tools.md: the largest --timeout
MANIFEST_ENTRY_KEYS = {"manifest", "valid", "name", "problems", "codes", "error"}
ERROR_KEYS = {"error", "errno", "message"}
REDOS_SCHEMA = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
# The tool every test's root holds, and those of the root the calls-only tests share, each
# granted to coder in both layers of P-6.  A tool runs in the host directory behind
# /workspace, so a relative ``touch`` leaves its mark there.
TOOLS = {"t": ("#!/bin/sh\ntouch ran-t\n", None)}
CALL_TOOLS = {
    "e": ("#!/bin/sh\ncat answer.json\nexit 4\n", None),
    "ok": ("#!/bin/sh\necho fine\n", None),
    "bad": ("#!/bin/sh\necho oops >&2\nexit 3\n", None),
    "noshebang": ("echo hi\n", None),
    "nointerp": ("#!/nonexistent/sh\necho hi\n", None),
    "slow": ("#!/bin/sh\ntouch ran-slow\nsleep 30\n", None),
    "redos": ("#!/bin/sh\ntouch ran-redos\n", REDOS_SCHEMA),
}


def manifest_of(name: str, schema: dict | None = None, **fields) -> dict:
    """A v2 manifest (T-8) of tool ``name`` whose program is ``<name>.sh`` beside it."""
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": schema if schema is not None else {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": f"{name}.sh",
    }
    document.update(fields)
    return document


# ------------------------------------------------------------------------------ the world


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root holding :data:`TOOLS` and agent ``coder`` (label ``coder_t``,
    running as ``nobody``) whose read-write workspace ``ws`` every uid may write, and a
    directory for manifests."""

    top: Path
    storage: Path
    ws: Path
    manifests: Path
    uid: int = 0

    def manifest(self, name: str, document: dict | str, program: str | None = None) -> Path:
        """``manifests/<name>.json`` holding ``document`` (text as it is, or a dict dumped),
        with ``program`` written to ``manifests/<name>.sh`` when given."""
        if program is not None:
            (self.manifests / f"{name}.sh").write_text(program)
        path = self.manifests / f"{name}.json"
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        return path

    def native(self, tool: str, data: str | bytes = "{}", *options: str, **kw) -> Run:
        return self.ctx("run", "--agent", "coder", "--native", *options, tool, input=data, **kw)

    def terminal(self, tool: str, *argv: str, options: tuple[str, ...] = ()) -> Run:
        return self.ctx("run", "--agent", "coder", *options, tool, *argv)

    def session_dir(self, name: str = "default") -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" / name

    def events(self, name: str = "default") -> list[dict]:
        return read_jsonl(self.session_dir(name) / "events.jsonl")

    def tool_dir(self, name: str) -> Path:
        return self.storage / "tool" / f"{name}.d"

    def marker(self, tag: str) -> Path:
        return self.ws / f"ran-{tag}"

    def listed(self, name: str) -> dict:
        """The ``ctx object list --json`` entry of system tool ``name``."""
        listing = self.ctx("object", "list", "--tier", "system", "--json")
        assert listing.rc == 0, listing
        (entry,) = [t for t in listing.json() if t["name"] == name]
        return entry


@pytest.fixture(scope="session")
def template() -> Iterator[World]:
    """Per test process: ``ctx bootstrap``, ``ctx agent create`` and ``ctx object install``
    of :data:`TOOLS` once; each test works on a copy."""
    top = new_scratch_dir(TOP, "template-")
    ws = top / "ws"
    ws.mkdir()
    manifests = top / "m"
    manifests.mkdir()
    w = World(top, top / "storage", ws, manifests)
    made = ctx_run("bootstrap", "--storage", w.storage)
    assert made.rc == 0, made
    agent = w.create_agent(
        {"name": "coder", "label": "coder_t", "mount": [[str(ws), "/workspace", "rw"]]}
    )
    w.uid = agent["identity"]["uid"]
    install_granted(w, TOOLS)
    yield w
    shutil.rmtree(top, ignore_errors=True)


def install_granted(w: World, tools: dict[str, tuple[str, dict | None]]) -> None:
    """``ctx object install`` each tool into the system tier, granted to coder (P-6)."""
    for name, (program, schema) in tools.items():
        path = w.manifest(name, manifest_of(name, schema=schema), program)
        installed = w.ctx("object", "install", path, "--tier", "system")
        assert installed.rc == 0, installed
        w.allow_tool("coder_t", name)
        with (w.storage / "agent" / "coder.d" / "policy").open("a") as policy:
            policy.write(f"allow coder_t tool:{name} execute\n")


@pytest.fixture
def world(template: World) -> Iterator[World]:
    """A copy of the template's root, its agent's mounts pointed at this copy and a new
    workspace, as docs/policy.md says to do for a root copied elsewhere ("edit its source in
    agent/coder.d/mount")."""
    top = new_scratch_dir(TOP, "w-")
    yield _copy_world(template, top)
    shutil.rmtree(top, ignore_errors=True)


def _copy_world(template: World, top: Path) -> World:
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
    return World(top, storage, ws, manifests, template.uid)


@pytest.fixture(scope="session")
def settled_root(template: World) -> Iterator[World]:
    """Per test process, one more copy for the tests that only provoke refusals that must
    change nothing (each checks that itself), with the homes of uids 1234 and 1235 holding
    sessions of an agent ``gone`` that no longer exists."""
    top = new_scratch_dir(TOP, "settled-")
    storage = copy_of_root(template.storage, top / "storage")
    for uid in (1234, 1235):
        gone = storage / "home" / str(uid) / "agent" / "gone" / "session" / "s1"
        gone.mkdir(parents=True)
        (gone / "events.jsonl").write_text("")
    yield World(top, storage, template.ws, template.manifests, template.uid)
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def settled(settled_root: World) -> World:
    """The shared root of :func:`settled_root`, with a scratch directory of this test's."""
    top = new_scratch_dir(settled_root.top, "s-")
    (top / "m").mkdir()
    return World(top, settled_root.storage, settled_root.ws, top / "m", settled_root.uid)


@pytest.fixture(scope="session")
def calls_root(template: World) -> Iterator[World]:
    """Per test process, one more world for the tests whose calls only add to the session
    (each looks at the events of its own calls, the last ones)."""
    top = new_scratch_dir(TOP, "calls-")
    w = _copy_world(template, top)
    install_granted(w, CALL_TOOLS)
    yield w
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def calls(calls_root: World) -> World:
    """The world of :func:`calls_root`, its workspace emptied for this test."""
    for entry in calls_root.ws.iterdir():
        entry.unlink()
    return calls_root


def result_frame(run: Run) -> dict:
    """The last frame of a native call, which must be its ``result``."""
    frames = [json.loads(line) for line in run.out.splitlines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", run
    return frames[-1]


def call_events(world: World, session: str = "default") -> list[dict]:
    return [e for e in world.events(session) if e["type"] in ("tool_call", "tool_result")]


def assert_refused_call(
    world: World,
    run: Run,
    errno_word: str,
    stage: str,
    step: int | None = None,
    *,
    recorded: bool = True,
) -> dict:
    """A native call refused with ``errno_word`` at ``stage`` (and chain ``step``): exit 1,
    a lone ``result`` frame (no ``call``: the tool never started), and, when ``recorded``,
    one ``tool_call``/``tool_result`` pair of its call id last in the session, else no
    event at all; the ``result`` error is returned."""
    assert run.rc == 1, run
    frame = result_frame(run)
    assert [json.loads(x)["type"] for x in run.out.splitlines()] == ["result"], run
    error = frame["error"]
    assert (frame["status"], frame["exit_status"], frame["output"]) == ("error", None, None)
    assert (error["error"], error["stage"], error["step"]) == (errno_word, stage, step), frame
    events = call_events(world)
    if not recorded:
        assert events == [], events
        return error
    assert [e["type"] for e in events][-2:] == ["tool_call", "tool_result"], events
    assert events[-1]["call"] == frame["call"] == events[-2]["call"], events
    assert (events[-1]["errno"], events[-1]["stage"], events[-1]["step"]) == (
        errno_word,
        stage,
        step,
    ), events[-1]
    return error


def closing(fd: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` closing descriptor ``fd`` in the child (``<&-``, ``>&-``)."""
    if fd is None:
        return None
    return lambda: os.close(fd)


# ------------------------------------------------------------------------------ manifests


def _eloop_link(world: World) -> Path:
    (world.manifests / "prog").symlink_to("/etc/hostname")
    return world.manifest("lnk", manifest_of("lnk", exec="prog"))


def _eloop_directory(world: World) -> Path:
    (world.manifests / "bin").symlink_to("/etc")
    return world.manifest("lnkdir", manifest_of("lnkdir", exec="bin/hostname"))


def _eloop_absolute(world: World) -> Path:
    (world.manifests / "real.sh").write_text("#!/bin/sh\n")
    (world.top / "abs.sh").symlink_to(world.manifests / "real.sh")
    return world.manifest("abs", manifest_of("abs", exec=str(world.top / "abs.sh")))


def _fifo_program(world: World) -> Path:
    os.mkfifo(world.manifests / "prog.fifo")
    return world.manifest("ff", manifest_of("ff", exec="prog.fifo"))


def _indented_schema(world: World) -> Path:
    # 200 000 items: some 400 KB as compact JSON, more than 1 MiB written indented.
    big = manifest_of("big", schema={"enum": [0] * 200000})
    return world.manifest("big", json.dumps(big, separators=(",", ":")), "#!/bin/sh\n")


def _text(name: str, text: str) -> Callable[[World], Path]:
    return lambda world: world.manifest(name, text, "#!/bin/sh\n")


def _doc(name: str, **fields) -> Callable[[World], Path]:
    return lambda world: world.manifest(name, manifest_of(name, **fields), "#!/bin/sh\n")


MCP = {"transport": "stdio", "config": "/srv/mcp/mcp.json", "server": "a", "tool": "b"}
_MCP_ONLY = {k: v for k, v in manifest_of("a.c").items() if k != "exec"}
REFUSED_MANIFESTS = [
    pytest.param(_doc("x.d", exec="x.d.sh"), "EINVAL", "name: ", id="name-ending-in-.d"),
    pytest.param(
        _text(
            "twice",
            '{"manifest":2,"kind":"tool","name":"twice","description":"d",'
            '"schema":{"type":"object"},"cap":{},"exec":"twice.sh","exec":"twice.sh"}',
        ),
        "EINVAL",
        "'exec' twice",
        id="a-key-given-twice-is-EINVAL",
    ),
    pytest.param(
        _doc("capb", cap={"side_effects": "false"}),
        "EINVAL",
        "cap/side_effects",
        id="cap-facts-side_effects-must-be-booleans",
    ),
    pytest.param(
        _doc("a.b", exec="a.b.sh", mcp=MCP),
        "EINVAL",
        "exactly one of 'exec'",
        id="exactly-one-of-exec-and-mcp",
    ),
    pytest.param(
        _doc("pol", policy="allow x_t tool:pol execute"),
        "EINVAL",
        "'policy'",
        id="no-other-field-in-particular-no-policy",
    ),
    pytest.param(
        _text("a.c", json.dumps({**_MCP_ONLY, "mcp": MCP})),
        "EINVAL",
        "'a.b'",
        id="mcp-backed-name-must-be-server.tool",
    ),
    pytest.param(
        _text(
            "sur",
            '{"manifest":2,"kind":"tool","name":"sur","description":"d\\ud800",'
            '"schema":{"type":"object"},"cap":{},"exec":"sur.sh"}',
        ),
        "EINVAL",
        "description: ",
        id="a-lone-surrogate-is-refused-naming-the-field",
    ),
    pytest.param(
        _eloop_link, "ELOOP", "prog is a symbolic link (to /etc/hostname)", id="exec-a-link-ELOOP"
    ),
    pytest.param(
        _eloop_directory,
        "ELOOP",
        "bin is a symbolic link (to /etc)",
        id="exec-through-bin-to-etc-ELOOP",
    ),
    pytest.param(
        _eloop_absolute, "ELOOP", "symbolic link", id="absolute-exec-a-final-link-is-ELOOP"
    ),
    pytest.param(
        _fifo_program, "EINVAL", "prog.fifo", id="program-a-FIFO-is-EINVAL-never-waited-on"
    ),
    pytest.param(
        _indented_schema,
        "EFBIG",
        f"more than the {CONTROL_LIMIT} bytes",
        id="controls-larger-as-installed-are-EFBIG",
    ),
]


@pytest.mark.parametrize(("build", "code", "fragment"), REFUSED_MANIFESTS)
def test_a_refused_manifest_is_listed_by_check_and_installs_nothing(settled, build, code, fragment):
    """T-8, docs/tools.md "Manifests, version 2" and "How the manifest and its program are
    read": every reason is a line ``MANIFEST: ERRNO: reason`` on stderr, exit 1; ``--json``
    lists it in ``problems`` with its errno in ``codes`` (one per problem), ``error`` null;
    ``install`` refuses with that errno, exit 1, and nothing is installed."""
    manifest = build(settled)
    as_json = settled.ctx("object", "check", "--json", manifest, timeout=20)
    assert as_json.rc == 1, as_json
    (entry,) = as_json.json()
    assert set(entry) == MANIFEST_ENTRY_KEYS, entry
    assert (entry["valid"], entry["name"], entry["error"]) == (False, None, None), entry
    assert len(entry["problems"]) == len(entry["codes"]) >= 1, entry
    assert any(
        c == code and fragment in p for c, p in zip(entry["codes"], entry["problems"], strict=True)
    ), entry
    # The same reasons, one line each, on stderr without --json.
    lines = [
        f"{manifest}: {c}: {p}" for c, p in zip(entry["codes"], entry["problems"], strict=True)
    ]
    assert as_json.err.splitlines() == lines, as_json
    before = snapshot(settled.storage)
    installed = settled.ctx("object", "install", manifest, "--tier", "system", timeout=20)
    assert installed.rc == 1 and installed.out == "", installed
    assert installed.err.startswith(f"ctx: {code}: "), installed
    assert snapshot(settled.storage) == before


def test_a_manifest_that_cannot_be_read_is_one_line_with_its_own_errno(settled):
    """docs/tools.md: "A manifest that cannot be read at all is one line with its own errno
    (ENOENT for a missing file; EINVAL for a FIFO, device or directory)", never waited on;
    ``check --json`` gives each entry the same keys, ``error`` being ``{"error", "errno",
    "message"}``; ``install`` of one installs nothing."""
    missing = settled.manifests / "missing.json"
    fifo = settled.manifests / "fifo.json"
    os.mkfifo(fifo)
    directory = settled.manifests / "dir.json"
    directory.mkdir()
    expected = {missing: ("ENOENT", 2), fifo: ("EINVAL", 22), directory: ("EINVAL", 22)}
    checked = settled.ctx("object", "check", *expected, timeout=20)
    assert checked.rc == 1, checked
    lines = checked.err.splitlines()
    assert len(lines) == 3, checked
    for line, (path, (word, _)) in zip(lines, expected.items(), strict=True):
        assert line.startswith(f"{path}: {word}: "), (line, path)
    as_json = settled.ctx("object", "check", "--json", *expected, timeout=20)
    assert as_json.rc == 1, as_json
    for entry, (path, (word, number)) in zip(as_json.json(), expected.items(), strict=True):
        assert set(entry) == MANIFEST_ENTRY_KEYS, entry
        assert entry["manifest"] == str(path), entry
        assert (entry["valid"], entry["name"], entry["problems"], entry["codes"]) == (
            False,
            None,
            [],
            [],
        ), entry
        assert set(entry["error"]) == ERROR_KEYS, entry
        assert (entry["error"]["error"], entry["error"]["errno"]) == (word, number), entry
    before = snapshot(settled.storage)
    for path, (word, _) in expected.items():
        installed = settled.ctx("object", "install", path, "--tier", "system", timeout=20)
        assert installed.rc == 1 and installed.err.startswith(f"ctx: {word}: "), installed
    assert snapshot(settled.storage) == before


def test_another_uids_manifest_may_name_only_what_that_uid_could_read(
    settled, unprivileged_user: UnprivilegedUser
):
    """docs/tools.md "How the manifest and its program are read": in another uid's manifest
    an absolute ``exec`` (or one with ``..``) is ``EACCES``; so is a program that uid could
    not read by its mode bits, naming the program and the manifest, and one below a directory
    it may not pass, naming that directory; ``install`` installs nothing."""
    uid = unprivileged_user.uid
    drop = settled.top / "drop"
    drop.mkdir()
    drop.chmod(0o1777)
    (drop / "secret.sh").write_text("#!/bin/sh\n")
    (drop / "secret.sh").chmod(0o600)
    private = drop / "private"
    private.mkdir()
    private.chmod(0o700)
    (private / "key.sh").write_text("#!/bin/sh\n")
    (private / "key.sh").chmod(0o644)
    (settled.manifests / "up.sh").write_text("#!/bin/sh\n")
    cases = {
        "abs": ("/etc/hostname", "exec: /etc/hostname is outside the manifest's directory"),
        "up": ("../m/up.sh", "exec: ../m/up.sh is outside the manifest's directory"),
        "unreadable": ("secret.sh", f"(uid 0, gid 0, mode 0600) is not readable by uid {uid}"),
        "private": ("private/key.sh", f"uid {uid}, who owns the manifest"),
    }
    manifests = []
    for name, (exec_, _) in cases.items():
        manifest = drop / f"{name}.json"
        manifest.write_text(json.dumps(manifest_of(name, exec=exec_)))
        os.chown(manifest, uid, -1)
        manifests.append(manifest)
    checked = settled.ctx("object", "check", *manifests)
    assert checked.rc == 1, checked
    lines = checked.err.splitlines()
    assert len(lines) == len(cases), checked
    for line, manifest, (_, fragment) in zip(lines, manifests, cases.values(), strict=True):
        assert line.startswith(f"{manifest}: EACCES: exec: "), line
        assert fragment in line, (line, fragment)
    assert f"may not pass {private} (uid 0, gid 0, mode 0700)" in lines[3], lines[3]
    assert f"{drop}/secret.sh" in lines[2] and str(manifests[2]) in lines[2].split(": ", 2)[2]
    codes = [e["codes"] for e in settled.ctx("object", "check", "--json", *manifests).json()]
    assert codes == [["EACCES"]] * len(cases), codes
    before = snapshot(settled.storage)
    for manifest in manifests:
        installed = settled.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 1 and installed.err.startswith("ctx: EACCES: "), installed
    assert snapshot(settled.storage) == before


def _plant(kind: str) -> Callable[[World], None]:
    def plant(world: World) -> None:
        tier = world.storage / "tool"
        if kind == "dir":
            (tier / "zz").mkdir()
        elif kind == "file-at-d":
            (tier / "zz.d").touch()
        elif kind == "link":
            (tier / "zz").symlink_to("/bin/true")
        elif kind == "fifo":
            os.mkfifo(tier / "zz")
        elif kind == "hooks-file":
            shutil.rmtree(world.tool_dir("t") / "hooks")
            (world.tool_dir("t") / "hooks").touch()
        world.manifest("zz", manifest_of("zz"), "#!/bin/sh\n")
        world.manifest("t", manifest_of("t"), "#!/bin/sh\n")
        world.manifest("core", manifest_of("fs.read", exec="core.sh"), "#!/bin/sh\n")
        world.manifest("tsh", manifest_of("tsh"), "#!/bin/sh\n")
        world.manifest("agent.create", manifest_of("agent.create"), "#!/bin/sh\n")
        (world.top / "other").mkdir()

    return plant


INSTALL_REFUSALS = [
    pytest.param(
        "core",
        ["object", "install", "{m}/core.json", "--tier", "system"],
        1,
        "ctx: EEXIST: fs.read is a core tool, maintained by 'ctx bootstrap'",
        id="core-name-fs.read-EEXIST",
    ),
    pytest.param(
        "core",
        ["object", "install", "{m}/tsh.json", "--tier", "system"],
        1,
        "ctx: EEXIST: tsh is a core tool, maintained by 'ctx bootstrap'",
        id="core-name-tsh-EEXIST",
    ),
    pytest.param(
        "core",
        ["object", "install", "{m}/agent.create.json", "--tier", "system"],
        1,
        "ctx: EEXIST: agent.create is a core tool, maintained by 'ctx bootstrap'",
        id="core-name-agent.create-EEXIST",
    ),
    pytest.param(
        "roots",
        [
            "object",
            "install",
            "{m}/zz.json",
            "--tier",
            "system",
            "--source",
            "{s}",
            "--storage",
            "{o}",
        ],
        2,
        "ctx: EINVAL: ",
        id="--source-and---storage-naming-two-roots",
    ),
    pytest.param(
        "roots",
        [
            "--storage",
            "{o}",
            "object",
            "install",
            "--source",
            "{s}",
            "{m}/zz.json",
            "--tier",
            "system",
        ],
        2,
        "ctx: EINVAL: ",
        id="ctx---storage-A-object-install---source-B",
    ),
    pytest.param(
        "tier",
        ["object", "install", "{m}/zz.json", "--tier", "bogus"],
        2,
        "ctx: EINVAL: ",
        id="install---tier-bogus",
    ),
    pytest.param(
        "tier",
        ["object", "list", "--tier", "shared:cortexfs-docs"],
        2,
        "ctx: EINVAL: ",
        id="list---tier-shared:cortexfs-docs",
    ),
    pytest.param(
        "dir",
        ["object", "install", "{m}/zz.json", "--tier", "system"],
        1,
        "ctx: EISDIR: {s}/tool/zz is a directory",
        id="a-directory-at-tool-name-EISDIR",
    ),
    pytest.param(
        "file-at-d",
        ["object", "install", "{m}/zz.json", "--tier", "system"],
        1,
        "ctx: ENOTDIR: {s}/tool/zz.d is a file",
        id="a-file-at-name.d-ENOTDIR",
    ),
    pytest.param(
        "link",
        ["object", "install", "{m}/zz.json", "--tier", "system"],
        1,
        "ctx: EEXIST: {s}/tool/zz is a symbolic link",
        id="a-symlink-at-tool-name-EEXIST",
    ),
    pytest.param(
        "fifo",
        ["object", "install", "{m}/zz.json", "--tier", "system"],
        1,
        "ctx: EEXIST: {s}/tool/zz is a special file",
        id="a-special-file-EEXIST",
    ),
    pytest.param(
        "hooks-file",
        ["object", "install", "{m}/t.json", "--tier", "system"],
        1,
        "ctx: ENOTDIR: {s}/tool/t.d/hooks is a file",
        id="a-file-at-name.d-hooks-ENOTDIR",
    ),
]


@pytest.mark.parametrize(("setup", "words", "rc", "start"), INSTALL_REFUSALS)
def test_a_refused_install_or_listing_changes_nothing(request, setup, words, rc, start):
    """docs/tools.md and ``ctx object install --help``: a core tool's name (or ``tsh``) in
    the system tier is ``EEXIST``, exit 1; ``--source`` and ``--storage`` naming two roots
    (either way round) and a malformed ``--tier`` are usage errors, ``EINVAL``, exit 2; a
    directory at ``tool/<name>`` is ``EISDIR``, a file at ``<name>.d`` or ``<name>.d/hooks``
    ``ENOTDIR``, a symlink or a special file ``EEXIST``, naming the path: nothing is changed
    in either root."""
    planting = setup not in ("core", "roots", "tier")
    world = request.getfixturevalue("world" if planting else "settled")
    _plant(setup)(world)
    other = world.top / "other"
    argv = [w.format(m=world.manifests, s=world.storage, o=other) for w in words]
    before = snapshot(world.storage)
    refused = world.ctx(*argv)
    assert refused.rc == rc, refused
    assert refused.err.startswith(start.format(s=world.storage)), refused
    assert refused.out == "", refused
    assert snapshot(world.storage) == before
    assert list(other.iterdir()) == []


# ------------------------------------------------------------------------ listing and CTX_PATH


def test_list_and_which_that_find_nothing_are_enoent_exit_1(settled):
    """T-8a, docs/tools.md "Listing and resolving": ``list`` of a root that does not exist,
    or of a tier whose directory does not exist, is ENOENT (exit 1), not an empty listing;
    ``which`` that finds nothing is ENOENT (exit 1) naming the search path (its first 16
    entries and how many more) and what it passed over and why, and on a root without a
    system tier the ``ctx bootstrap --storage ROOT`` that installs the core tools."""
    gone = settled.top / "no-such-root"
    for argv in (("--storage", gone), ("--tier", "shared:nosuch")):
        listed = settled.ctx("object", "list", *argv)
        assert listed.rc == 1 and listed.out == "", listed
        assert listed.err.startswith("ctx: ENOENT: "), listed
    assert not gone.exists()
    nothing = settled.ctx("object", "which", "nosuch")
    assert nothing.rc == 1 and nothing.out == "", nothing
    assert nothing.err.startswith("ctx: ENOENT: nosuch is not on CTX_PATH ("), nothing
    dirs = [settled.top / f"p{i}" for i in range(20)]
    for d in dirs[:2]:
        d.mkdir()
    (dirs[0] / "foo").write_text("#!/bin/sh\n")  # no execute bit: not a hit
    (dirs[1] / "foo").symlink_to("/bin/true")  # a symbolic link: not a hit
    env = {**settled.env, "CTX_PATH": ":".join(map(str, dirs))}
    skipped = settled.ctx("object", "which", "--json", "foo", env=env)
    assert skipped.rc == 1, skipped
    answer = skipped.json()
    assert set(answer) == ERROR_KEYS and answer["error"] == "ENOENT", answer
    assert f"{dirs[15]} … and 4 more" in answer["message"], answer
    assert f"{dirs[16]}" not in answer["message"], answer
    assert f"{dirs[0]}/foo: not executable" in answer["message"], answer
    assert f"{dirs[1]}/foo: a symbolic link" in answer["message"], answer
    bare = settled.top / "bare"
    bare.mkdir()
    empty = ctx_run("object", "which", "fs.read", env=clean_env(CTX_STORAGE=str(bare)))
    assert empty.rc == 1 and empty.err.startswith("ctx: ENOENT: "), empty
    assert f"'ctx bootstrap --storage {bare}'" in empty.err, empty
    assert list(bare.iterdir()) == []


@pytest.mark.parametrize(
    ("shape", "code"),
    [
        pytest.param("over-64-KiB", "EINVAL", id="tshrc-over-64-KiB"),
        pytest.param("nul", "EINVAL", id="tshrc-CTX_PATH-line-holding-a-NUL"),
        pytest.param("directory", "EINVAL", id="tshrc-a-directory"),
        pytest.param("fifo", "EINVAL", id="tshrc-a-FIFO"),
        pytest.param("link", "EPERM", id="tshrc-a-link-to-another-users-file"),
    ],
)
def test_a_tshrc_that_cannot_be_used_is_refused_by_ctx(settled, shape, code):
    """T-4, docs/tools.md "CTX_PATH": a ``.tshrc`` that is a directory, a FIFO, a link to
    another user's file or over 64 KiB, or whose ``CTX_PATH`` line holds a NUL, is refused:
    ``ctx`` exits with ``EINVAL`` or ``EPERM`` (exit 1) naming it, and resolves nothing."""
    home = settled.top / "home"
    home.mkdir()
    os.chown(home, 4242, 4242)
    tshrc = home / ".tshrc"
    if shape == "over-64-KiB":
        tshrc.write_text("#" * 70000 + "\n")
    elif shape == "nul":
        tshrc.write_bytes(b"CTX_PATH=/tmp\x00/x\n")
    elif shape == "directory":
        tshrc.mkdir()
    elif shape == "fifo":
        os.mkfifo(tshrc)
    else:
        tshrc.symlink_to("/etc/passwd")  # root's file, in the home of uid 4242
    refused = settled.ctx("object", "which", "fs.read", env={**settled.env, "CTX_HOME": str(home)})
    assert refused.rc == 1 and refused.out == "", refused
    assert refused.err.startswith(f"ctx: {code}: {tshrc}"), refused
    assert "root:" not in refused.err, refused


# ------------------------------------------------------------------------------ the tool's controls


def _damage(world: World, kind: str) -> None:
    d = world.tool_dir("t")
    if kind == "schema-not-JSON":
        (d / "schema").write_text("{")
    elif kind == "status-missing":
        (d / "status").unlink()
    elif kind == "control-directory-missing":
        shutil.rmtree(d)
    elif kind == "hooks-pre.d-a-link":
        (d / "hooks" / "pre.d").rmdir()
        (d / "hooks" / "pre.d").symlink_to(world.top)
    elif kind == "name-names-another-tool":
        (d / "name").write_text("other\n")


@pytest.mark.parametrize(
    "kind",
    [
        "schema-not-JSON",
        "status-missing",
        "control-directory-missing",
        "hooks-pre.d-a-link",
        "name-names-another-tool",
    ],
)
def test_a_damaged_tool_fails_with_enoexec_at_resolve_and_nothing_is_made_up(world, kind):
    """T-1, docs/tools.md "A tool on disk": a control missing or malformed, or the control
    directory missing altogether, makes the tool damaged: ``ENOEXEC`` at stage ``resolve`` (a
    ``result`` frame in native mode, exit 126 in terminal mode, ``tool_call``/``tool_result``
    in the session) naming the remedy for its tier; ``ctx object list`` shows it
    ``damaged``; no control directory or log is made up for it, and its program never
    runs."""
    _damage(world, kind)
    error = assert_refused_call(world, world.native("t"), "ENOEXEC", "resolve")
    assert error["errno"] == 8, error
    assert error["message"].startswith(f"tool t in {world.storage}/tool is damaged: "), error
    assert "'ctx object install MANIFEST --tier system'" in error["message"], error
    if kind == "schema-not-JSON":
        terminal = world.terminal("t")
        assert terminal.rc == 126 and terminal.out == "", terminal
        assert terminal.err == f"ctx: ENOEXEC: {error['message']}\n", terminal
    entry = world.listed("t")
    assert entry["status"] == "damaged" and entry["problems"], entry
    assert not world.marker("t").exists()
    if kind == "control-directory-missing":
        assert not world.tool_dir("t").exists()


@pytest.mark.parametrize(
    ("control", "size", "stage", "step"),
    [
        pytest.param("tool:cap", 2 << 30, "resolve", None, id="tool-cap-grown-sparse-to-2-GiB"),
        pytest.param(
            "tool:description",
            CONTROL_LIMIT + 1,
            "resolve",
            None,
            id="tool-description",
        ),
        pytest.param(
            "tool:origin",
            CONTROL_LIMIT + 1,
            "resolve",
            None,
            id="tool-origin",
        ),
        pytest.param("tool:policy", POLICY_LIMIT + 1, "authorize", 6, id="tool-policy-step-6"),
        pytest.param("agent:policy", POLICY_LIMIT + 1, "authorize", 5, id="agent-policy-step-5"),
        pytest.param("agent:identity", CONTROL_LIMIT + 1, "agent", None, id="agent-identity"),
    ],
)
def test_a_control_over_its_limit_is_efbig_naming_it_and_the_limit(
    world, control, size, stage, step
):
    """docs/tools.md "A tool on disk" and docs/policy.md "What the chain reads": a control is
    read no further than a byte past its limit, 16777216 bytes for a policy and 1048576 for
    any other; a larger one is ``EFBIG`` naming it and its limit, the chain denying at the
    step that reads it; ``ctx object list`` shows such a tool ``damaged`` with the same
    sentence, ``ctx policy explain`` denies with ``EFBIG``."""
    owner, name = control.split(":")
    path = world.tool_dir("t") / name if owner == "tool" else world.storage / "agent/coder.d" / name
    os.truncate(path, size)  # grown sparse: holes, no data
    limit = POLICY_LIMIT if name == "policy" else CONTROL_LIMIT
    terminal = world.terminal("t")
    assert terminal.rc == 126, terminal
    assert terminal.err.startswith("ctx: EFBIG: "), terminal
    assert f"{name} holds more than {limit} bytes, the limit of a" in terminal.err, terminal
    # The identity gives the home, and with it the session: no session to record in.
    error = assert_refused_call(
        world, world.native("t"), "EFBIG", stage, step, recorded=name != "identity"
    )
    assert f"{name} holds more than {limit} bytes, the limit of a" in error["message"], error
    if owner == "tool":
        entry = world.listed("t")
        assert entry["status"] == "damaged", entry
        assert any(f"t.d/{name} holds more than {limit} bytes" in p for p in entry["problems"])
    else:
        explained = world.ctx("policy", "explain", "coder", "tool:t", "execute")
        assert explained.rc == 1, explained
        assert explained.out.splitlines()[-1].startswith("deny: EFBIG: step "), explained
    assert not world.marker("t").exists()


@pytest.mark.parametrize(
    ("status_text", "shown"),
    [
        pytest.param("disabled\n", "disabled", id="disabled"),
        pytest.param("unavailable: maintenance\n", "unavailable", id="unavailable-with-reason"),
        pytest.param("Available\n", "unavailable", id="none-of-the-three-settings"),
    ],
)
def test_a_tool_whose_status_is_not_available_is_refused_eacces_before_the_chain(
    world, status_text, shown
):
    """docs/tools.md: "a call is refused (EACCES) unless it reads available"; the listing's
    status is what a call would meet; ``ctx policy explain`` of such a tool still allows, with
    a note on stderr, and exits 0 (docs/policy.md)."""
    (world.tool_dir("t") / "status").write_text(status_text)
    terminal = world.terminal("t")
    assert terminal.rc == 126, terminal
    assert terminal.err.startswith("ctx: EACCES: tool t is not available (status: "), terminal
    assert_refused_call(world, world.native("t"), "EACCES", "resolve")
    assert world.listed("t")["status"] == shown
    if shown != "disabled":
        return
    explained = world.ctx("policy", "explain", "coder", "tool:t", "execute")
    assert explained.rc == 0 and explained.out.splitlines()[-1] == "allow", explained
    assert explained.err.startswith(
        "ctx: note: the chain allows it, but a call is refused before the chain: tool t is "
        "not available"
    ), explained
    assert not world.marker("t").exists()


@pytest.mark.parametrize("how", ["missing", "a-link"])
def test_a_tool_without_a_usable_policy_is_refused_at_step_6(world, how):
    """P-6, docs/tools.md: the tool's own ``policy``, missing or a link, allows nothing: the
    call is refused by the chain at step 6 (``EACCES``, the step named, as ``ctx policy
    explain`` says), though ``ctx object list`` lists the tool as damaged."""
    policy = world.tool_dir("t") / "policy"
    kept = world.top / "kept-policy"
    policy.rename(kept)
    if how == "a-link":
        policy.symlink_to(kept)
    terminal = world.terminal("t")
    assert terminal.rc == 126, terminal
    assert terminal.err.startswith("ctx: EACCES: step 6 (tool/model policy): "), terminal
    error = assert_refused_call(world, world.native("t"), "EACCES", "authorize", 6)
    assert error["step_name"] == "tool/model policy", error
    if how == "missing":
        assert error["message"] == (
            "step 6 (tool/model policy): no policy, so nothing is allowed "
            "(tool/t.d/policy is missing)"
        ), error
    explained = world.ctx("policy", "explain", "coder", "tool:t", "execute")
    assert explained.rc == 1, explained
    assert explained.out.splitlines()[-1].startswith("deny: EACCES: step 6 (tool/model policy)")
    assert world.listed("t")["status"] == "damaged"
    assert not world.marker("t").exists()


# ------------------------------------------------------------------------------ native input


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param("not json", "not JSON", id="not-JSON"),
        pytest.param('{"a": 1, "a": 2}', "'a' twice", id="a-name-given-twice"),
        pytest.param('{"a": NaN}', "NaN", id="NaN"),
        pytest.param('{"a": Infinity}', "Infinity", id="Infinity"),
        pytest.param('{"a": 1e999}', "1e999", id="a-number-beyond-a-float"),
        pytest.param('{"a": ' + "[" * 128 + "]" * 128 + "}", "128", id="nesting-past-128"),
    ],
)
def test_native_input_that_is_not_json_is_einval_at_schema_exit_2_and_recorded(
    calls, data, fragment
):
    """docs/tools.md "Agent native mode": input that is not JSON, or that JSON readers
    disagree on (a name twice, ``NaN``, ``Infinity``, a number beyond a float, nesting
    deeper than 128 levels), is refused at stage ``schema`` like input the schema refuses: a
    ``result`` frame with ``EINVAL``, exit 2, the call recorded in the session (its input as
    text); the tool never starts."""
    refused = calls.native("t", data)
    assert refused.rc == 2, refused
    error = result_frame(refused)["error"]
    assert (error["error"], error["errno"], error["stage"]) == ("EINVAL", 22, "schema"), error
    assert fragment in error["message"], error
    call, answer = call_events(calls)[-2:]
    assert (call["type"], answer["type"]) == ("tool_call", "tool_result")
    assert isinstance(call["input"], str) and data.startswith(call["input"][:100]), call
    assert (answer["errno"], answer["stage"]) == ("EINVAL", "schema"), answer
    assert not calls.marker("t").exists()
    if fragment == "128":  # 128 levels are JSON still
        exactly = calls.native("t", '{"a": ' + "[" * 127 + "]" * 127 + "}")
        assert exactly.rc == 0, exactly


REFUSED_BEFORE_START = [
    pytest.param("over-16-MiB", 1, "ctx: EFBIG: ", id="an-input-over-16-MiB-is-EFBIG-exit-1"),
    pytest.param(
        "stdin-closed", 1, "ctx: EBADF: standard input is closed", id="stdin-closed-EBADF-exit-1"
    ),
    pytest.param(
        "stdin-write-only",
        1,
        "ctx: EBADF: standard input is open for writing only",
        id="stdin-0>>FILE-EBADF-exit-1",
    ),
    pytest.param(
        "stdout-closed",
        74,
        "ctx: EBADF: cannot write standard output (closed when ctx started",
        id="stdout-closed-EBADF-exit-74",
    ),
    pytest.param("--agent=.bad", 2, "ctx: EINVAL: illegal agent name", id="agent-.bad"),
    pytest.param("--session=a/b", 2, "ctx: EINVAL: illegal session name", id="session-a/b"),
    pytest.param("tool=x.d", 2, "ctx: EINVAL: illegal tool name", id="tool-x.d"),
    pytest.param("no-agent", 2, "ctx: EINVAL: Missing option '--agent'.", id="missing---agent"),
    pytest.param("--nat", 2, "ctx: EINVAL: No such option '--nat'", id="--nat-is-no---native"),
    pytest.param(
        f"--timeout={YEAR_AND_A_DAY + 1}",
        2,
        "ctx: EINVAL: Invalid value for '--timeout'",
        id="timeout-past-a-year-and-a-day",
    ),
]


@pytest.mark.parametrize(("how", "rc", "said"), REFUSED_BEFORE_START)
def test_a_call_refused_before_it_starts_records_nothing(settled, how, rc, said):
    """docs/tools.md and ``ctx run --help``: an input over 16 MiB is ``EFBIG``, exit 1; a
    standard input closed, or open for writing only, ``EBADF``, exit 1; a standard output
    closed at start ``EBADF``, exit 74; an agent, tool, space or session name that is not an
    object name, a missing ``--agent`` (``Usage: ctx run …`` then ``ctx: EINVAL: Missing
    option '--agent'.``), an option not spelt out, a ``--timeout`` not above 0 and at most a
    year and a day: ``EINVAL``, exit 2 — each before anything is run or recorded."""
    options, tool = ["--agent", "coder"], "t"
    if how.startswith(("--agent=", "--session=", "--project=", "--timeout=")):
        option, value = how.split("=")
        options = ["--agent", "coder", option, value] if option != "--agent" else [option, value]
    elif how == "tool=x.d":
        tool = "x.d"
    elif how == "no-agent":
        options = []
    elif how == "--nat":
        options = ["--agent", "coder", "--nat"]
    argv = [*CTX_ARGV, "run", *(["--native"] if how != "--nat" else []), *options, tool]
    data = b'"' + b"a" * (INPUT_LIMIT - 1) + b'"' if how == "over-16-MiB" else b"{}"
    before = snapshot(settled.storage)
    stdin: int | None = subprocess.PIPE
    if how == "stdin-write-only":
        stdin = os.open(settled.top / "sink", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    elif how == "stdin-closed":
        stdin = None
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=None if how == "stdout-closed" else subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=settled.env,
            preexec_fn=closing({"stdin-closed": 0, "stdout-closed": 1}.get(how)),
        )
        out, err = proc.communicate(data if stdin == subprocess.PIPE else None, timeout=60)
    finally:
        if how == "stdin-write-only":
            os.close(stdin)
    text = err.decode()
    assert proc.returncode == rc, (proc.returncode, text)
    if how in ("no-agent", "--nat") or how.startswith("--timeout"):
        assert text.startswith("Usage: ctx run [OPTIONS] TOOL [ARGS]..."), text
        assert text.splitlines()[-1].startswith(said), text
    else:
        assert text.startswith(said) and text.count("\n") == 1, text
    assert not out, out
    assert snapshot(settled.storage) == before
    assert not settled.marker("t").exists()


def test_the_schema_is_judged_after_authorize_and_a_slow_pattern_is_etimedout(calls):
    """docs/tools.md stage ``schema``: judged only after ``authorize``, so an agent without
    the grant gets ``EACCES`` whatever its input (exit 1, not 2); with a timeout, an input
    whose schema's pattern may backtrack for ever is refused ``ETIMEDOUT`` at stage
    ``schema``, and ``ctx run --native`` exits 1, not 2; ``--timeout`` of exactly a year and
    a day is taken."""
    denied = calls.native("fs.write", "not json")
    error = assert_refused_call(calls, denied, "EACCES", "authorize", 5)
    assert error["message"] == (
        "step 5 (object policy): agent/coder.d/policy has no rule "
        "'allow coder_t tool:fs.write execute'"
    ), error
    slow = calls.native("redos", json.dumps({"s": "a" * 40 + "!"}), "--timeout", "0.5")
    assert slow.rc == 1, slow
    frame = result_frame(slow)
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("ETIMEDOUT", "schema"), frame
    assert call_events(calls)[-1]["errno"] == "ETIMEDOUT"
    assert not calls.marker("redos").exists()
    longest = calls.native("t", "{}", "--timeout", str(YEAR_AND_A_DAY))
    assert longest.rc == 0, longest


# ------------------------------------------------------------------------------ hooks


PRE_HOOKS = [
    pytest.param(
        "veto",
        "hook",
        None,
        "hooks/pre.d/10-guard vetoed the call (exit 3): no way",
        id="a-non-zero-exit-vetoes-quoting-the-last-stderr-line",
    ),
    pytest.param(
        "symlink",
        "hook",
        None,
        "hooks/pre.d/10-guard vetoed the call (exit 126)",
        id="a-symlink-is-never-followed-a-veto",
    ),
    pytest.param(
        "no-shebang",
        "hook",
        None,
        "hooks/pre.d/10-guard vetoed the call (exit 126)",
        id="a-text-without-#!-is-a-veto",
    ),
    pytest.param(
        "fifo",
        "hook",
        None,
        "hooks/pre.d/10-guard vetoed the call (exit 126)",
        id="a-FIFO-is-a-veto",
    ),
    pytest.param(
        "timeout",
        "hook",
        None,
        "hooks/pre.d/10-guard vetoed the call (exit 137): ran past the call's timeout",
        id="pre-hooks-share-the-calls-timeout",
    ),
    pytest.param(
        "agent-owned",
        "authorize",
        6,
        "step 6 (tool/model policy): tool/t.d/hooks/pre.d/10-guard is not host-owned",
        id="a-pre-hook-the-agent-owns-step-6",
    ),
]


@pytest.mark.parametrize(("hook", "stage", "step", "said"), PRE_HOOKS)
def test_a_pre_hook_that_vetoes_or_cannot_run_refuses_the_call(world, hook, stage, step, said):
    """T-6, docs/tools.md "Hooks": a pre-hook that exits non-zero (or runs past the call's
    timeout, which the pre-hooks share with the tool) refuses the call with ``EACCES`` at
    stage ``hook``, naming it and quoting the last line of its stderr; a symbolic link, a
    FIFO or a text with no ``#!`` line is a failed hook, in ``pre.d`` a veto; a pre-hook of
    the agent's own uid is refused at step 6, naming it.  Later hooks do not run, nor does
    the tool."""
    pre = world.tool_dir("t") / "hooks" / "pre.d"
    guard = pre / "10-guard"
    if hook == "veto":
        guard.write_text("#!/bin/sh\necho first >&2\necho 'no way' >&2\nexit 3\n")
    elif hook == "symlink":
        guard.symlink_to("/bin/true")
    elif hook == "no-shebang":
        guard.write_text("exit 0\n")
    elif hook == "fifo":
        os.mkfifo(guard)
    elif hook == "timeout":
        guard.write_text("#!/bin/sh\nsleep 20\n")
    else:
        guard.write_text("#!/bin/sh\nexit 0\n")
        os.chown(guard, world.uid, -1)
    if not guard.is_symlink():
        guard.chmod(0o755)
    later = pre / "20-later"
    later.write_text("#!/bin/sh\ntouch ran-later\n")
    later.chmod(0o755)
    options = ("--timeout", "0.5") if hook == "timeout" else ()
    if hook in ("veto", "agent-owned"):
        terminal = world.terminal("t", options=options)
        assert terminal.rc == 126, terminal
        assert terminal.err.startswith(f"ctx: EACCES: {said}"), terminal
    error = assert_refused_call(world, world.native("t", "{}", *options), "EACCES", stage, step)
    assert error["message"].startswith(said), error
    assert not world.marker("t").exists() and not world.marker("later").exists()


# ------------------------------------------------------------------------------ exit, run, record


ERRNO_CASES = [
    pytest.param({"errno": 13, "message": "nope"}, "EACCES", id="a-number-naming-an-errno"),
    pytest.param({"errno": True, "message": "nope"}, None, id="true-is-no-errno"),
    pytest.param({"errno": "EACCES", "message": "nope"}, None, id="a-name-is-no-errno"),
    pytest.param({"errno": -5, "message": "nope"}, None, id="-5-names-no-errno"),
    pytest.param({"errno": 9999, "message": "nope"}, None, id="9999-names-no-errno"),
    pytest.param({"errno": 13, "message": 5}, None, id="a-message-that-is-not-a-string"),
    pytest.param({"errno": 13}, None, id="no-message"),
]


@pytest.mark.parametrize(("printed", "expected"), ERRNO_CASES)
def test_stage_exit_names_an_errno_only_for_a_number_and_a_string_message(calls, printed, expected):
    """docs/tools.md stage ``exit``: "its errno when it printed {"errno": N, "message": …}
    with N a number that names an errno (13, not true, -5 or "EACCES") and a string
    message, else error and errno null"; ``ctx run`` exits with the tool's status, the
    session's ``tool_result`` carries the same errno."""
    (calls.ws / "answer.json").write_text(json.dumps(printed))
    native = calls.native("e")
    assert native.rc == 1, native
    frame = result_frame(native)
    assert (frame["status"], frame["exit_status"], frame["output"]) == ("error", 4, printed)
    error = frame["error"]
    assert error["stage"] == "exit", error
    assert (error["error"], error["errno"]) == (expected, 13 if expected else None), error
    assert call_events(calls)[-1]["errno"] == expected
    if expected:
        assert calls.terminal("e").rc == 4


def test_run_stage_failures_name_their_errno_and_never_an_exit_status(calls):
    """docs/tools.md stage ``run``: ``ENOEXEC`` for a file of text with no ``#!`` line,
    ``ENOENT`` for an interpreter that is not there — never as an exit status 126 or 127 of a
    tool that never ran (``exit_status`` null); a timeout is ``ETIMEDOUT``, "timed out after
    Ns; its process group was killed"."""
    for tool, word in (("noshebang", "ENOEXEC"), ("nointerp", "ENOENT")):
        terminal = calls.terminal(tool)
        assert terminal.rc == 126, terminal
        assert terminal.err.startswith(f"ctx: {word}: cannot start {calls.storage}/tool/{tool}")
        frame = result_frame(calls.native(tool))
        assert frame["exit_status"] is None, frame
        assert (frame["error"]["error"], frame["error"]["stage"]) == (word, "run"), frame
        assert call_events(calls)[-1]["errno"] == word
    timed = calls.native("slow", "{}", "--timeout", "0.5")
    assert timed.rc == 1, timed
    frame = result_frame(timed)
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("ETIMEDOUT", "run"), frame
    assert frame["error"]["message"] == "timed out after 0.5s; its process group was killed"
    assert call_events(calls)[-1]["errno"] == "ETIMEDOUT"


def test_a_result_that_cannot_be_recorded_is_an_error_at_stage_record(calls):
    """docs/tools.md stage ``record``: a result that cannot be recorded in the tool's log (a
    log that cannot be opened: ``EPERM``…) makes the call an error whatever the tool did, its
    output and exit status kept (terminal mode: exit 1 when the tool exited 0); a call that
    had failed already keeps its error, which then says the record is missing too;
    docs/sessions.md: the session's line is written before the tool's log is opened."""
    with (
        attribute(calls.tool_dir("ok") / "log", "i"),
        attribute(calls.tool_dir("bad") / "log", "i"),
    ):
        terminal = calls.terminal("ok")
        assert (terminal.rc, terminal.out) == (1, "fine\n"), terminal
        assert terminal.err.startswith(
            "ctx: EPERM: the tool exited 0, but its result could not be recorded"
        ), terminal
        native = calls.native("ok")
        assert native.rc == 1, native
        frame = result_frame(native)
        assert (frame["status"], frame["exit_status"], frame["output"]) == ("error", 0, "fine\n")
        assert (frame["error"]["error"], frame["error"]["stage"]) == ("EPERM", "record"), frame
        assert call_events(calls)[-1]["call"] == frame["call"]
        failed = result_frame(calls.native("bad"))
        assert (failed["exit_status"], failed["error"]["stage"]) == (3, "exit"), failed
        assert "could not be recorded" in failed["error"]["message"], failed
        assert calls.terminal("bad").rc == 3
    assert (calls.tool_dir("ok") / "log").read_text() == ""
    assert (calls.tool_dir("bad") / "log").read_text() == ""


# ------------------------------------------------------------------------------ policy commands


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        pytest.param("fifo", "EINVAL: {f} is not a regular file", id="a-FIFO-never-waited-on"),
        pytest.param("directory", "EINVAL: {f} is not a regular file", id="a-directory"),
        pytest.param(
            "over-16-MiB", "EINVAL: {f} holds more than 16777216 bytes", id="a-file-over-16-MiB"
        ),
        pytest.param(
            "stdin-closed", "EBADF: standard input is closed", id="dash-with-stdin-closed"
        ),
    ],
)
def test_a_policy_file_that_cannot_be_read_is_refused_by_check_and_query(settled, kind, said):
    """P-8, docs/policy.md "Commands": a FILE must be a regular file (a FIFO is refused at
    once, as are a device and a directory) of at most 16 MiB, and ``-`` with standard input
    closed is ``EBADF``: ``check`` exits 1 with one line ``FILE: ERRNO: …`` (``--json``: one
    problem, ``line`` null), ``query`` exits 2 with the same sentence."""
    path = settled.top / "p.policy"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "over-16-MiB":
        with path.open("wb") as f:
            f.truncate(POLICY_LIMIT + 1)
    name = "-" if kind == "stdin-closed" else str(path)
    said = said.format(f=name)

    def ctx(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CTX_ARGV, *argv],
            stdin=None if kind == "stdin-closed" else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=settled.env,
            preexec_fn=closing(0 if kind == "stdin-closed" else None),
            timeout=20,
        )

    checked = ctx("policy", "check", name)
    assert (checked.returncode, checked.stdout) == (1, ""), checked
    assert checked.stderr.startswith(f"{name}: {said}"), checked
    assert checked.stderr.count("\n") == 1, checked
    as_json = ctx("policy", "check", "--json", name)
    assert as_json.returncode == 1, as_json
    report = json.loads(as_json.stdout)
    (problem,) = report["files"][0]["problems"]
    assert (report["valid"], report["files"][0]["valid"], problem["line"]) == (False, False, None)
    assert problem["error"] == said.split(":")[0], problem
    queried = ctx("policy", "query", "--policy", name, "a_t", "tool:x", "execute")
    assert (queried.returncode, queried.stdout) == (2, ""), queried
    assert queried.stderr.startswith(f"ctx: {said}"), queried


def test_malformed_policy_lines_queries_and_explanations_are_einval(settled):
    """P-2, P-3, P-4, P-8, docs/policy.md "Errors you will see": every invalid line is
    reported ``FILE:LINE: EINVAL: <reason>`` (exit 1); a malformed query, or a query of an
    invalid policy, exits 2 with ``EINVAL`` (the error object on stdout with ``--json``); a
    malformed ``explain`` request (a permission of another class, a session without
    ``--location``, a ``--peer`` that is not ``UID:GID``) exits 2."""
    policy = settled.top / "bad.policy"
    policy.write_text(
        textwrap.dedent(
            """\
            # a comment
            allow coder_t agent:* create
            deny coder_t tool:fs.read execute
            allow coder.d tool:fs.read execute
            allow coder_t shared:project-a read # read-only
            allow coder_t tool:fs.read read
            allow coder_t tool:/ctx/tool/fs.read execute
            allow coder_t network:internet connect
            allow coder_t tool:fs.read execute
            """
        )
    )
    checked = settled.ctx("policy", "check", policy)
    assert checked.rc == 1 and checked.out == "", checked
    expected = [
        "2: EINVAL: agent:*: globs are not supported (P-2); name each object",
        "3: EINVAL: there is no 'deny' (P-2): policy v0 denies whatever no rule allows",
        "4: EINVAL: illegal subject type: 'coder.d' ends in '.d'",
        "5: EINVAL: unexpected text after the permission: '# read-only'",
        "6: EINVAL: 'read' is a permission of shared, session, mount, agent, not of tool; "
        "tool has execute",
        "7: EINVAL: tool:/ctx/tool/fs.read: paths are not supported (P-2)",
        "8: EINVAL: network:internet: the only network object is 'default' (P-4)",
    ]
    lines = checked.err.splitlines()
    assert len(lines) == len(expected), checked
    for line, want in zip(lines, expected, strict=True):
        assert line.startswith(f"{policy}:{want}"), (line, want)
    good = settled.storage / "agent" / "coder.d" / "policy"
    for query in (["coder_t", "bogus:x", "read"], ["coder_t", "agent:*", "create"]):
        refused = settled.ctx("policy", "query", "--policy", good, *query)
        assert (refused.rc, refused.out) == (2, ""), refused
        assert refused.err.startswith("ctx: EINVAL: "), refused
    as_json = settled.ctx(
        "policy", "query", "--json", "--policy", good, "coder_t", "tool:x", "read"
    )
    assert as_json.rc == 2 and set(as_json.json()) == ERROR_KEYS, as_json
    assert (as_json.json()["error"], as_json.json()["errno"]) == ("EINVAL", 22), as_json
    invalid = settled.ctx(
        "policy", "query", "--policy", policy, "coder_t", "tool:fs.read", "execute"
    )
    assert (invalid.rc, invalid.out) == (2, ""), invalid
    assert invalid.err.splitlines() == lines, invalid
    for explain in (
        ["coder", "tool:x", "read"],
        ["coder", "session:default", "read"],
        ["coder", "tool:fs.read", "execute", "--peer", "abc"],
    ):
        refused = settled.ctx("policy", "explain", *explain)
        assert (refused.rc, refused.out) == (2, ""), refused
        assert refused.err.startswith("ctx: EINVAL: "), refused


# ------------------------------------------------------------------------------ sessions


SESSION_REFUSALS = [
    pytest.param(
        ["show", "coder", "--uid", "{uid}", "--project", "proj"],
        2,
        "ctx: EINVAL: ",
        id="--uid-and---project-at-once",
    ),
    pytest.param(
        ["show", "coder", "--uid", "4294967295"],
        2,
        "ctx: EINVAL: Invalid value for '--uid'",
        id="a-uid-past-4294967294",
    ),
    pytest.param(
        ["tail", "coder", "-n", "-1"], 2, "ctx: EINVAL: Invalid value for '-n'", id="tail--n--1"
    ),
    pytest.param(
        ["show", "coder", "default", "--session", "other"],
        2,
        "ctx: EINVAL: two sessions given",
        id="SESSION-and-a-different---session",
    ),
    pytest.param(
        ["show", "coder", "a/b"],
        2,
        "ctx: EINVAL: illegal session name",
        id="a-session-name-that-is-no-object-name",
    ),
    pytest.param(
        ["show", "gone"],
        2,
        "ctx: EINVAL: there is no agent 'gone', and the homes of uids 1234, "
        "1235 hold sessions of it; give --uid",
        id="several-homes-hold-a-gone-agents-sessions",
    ),
    pytest.param(
        ["show", "ghost"],
        1,
        "ctx: ENOENT: there is no agent 'ghost'",
        id="an-agent-with-no-sessions",
    ),
    pytest.param(
        ["show", "coder", "nosuch"],
        1,
        "ctx: ENOENT: there is no session "
        "home/{uid}/agent/coder/session/nosuch; 'ctx session list coder' lists the sessions",
        id="a-session-that-does-not-exist-names-ctx-session-list",
    ),
    pytest.param(
        ["list", "coder", "--project", "nospace"],
        1,
        "ctx: ENOENT: there is no shared space 'nospace'",
        id="a-space-that-does-not-exist",
    ),
]


@pytest.mark.parametrize(("argv", "rc", "said"), SESSION_REFUSALS)
def test_session_commands_refuse_with_the_documented_errno(settled, argv, rc, said):
    """docs/sessions.md "Commands" and docs/policy.md: ``--uid`` and ``--project`` at once,
    a ``--uid`` outside 0..4294967294, a ``-n`` outside 0..2^63−1, two different sessions,
    a gone agent whose sessions several homes hold: ``EINVAL``, exit 2; an agent that does not
    exist and has no sessions, a session or a space that does not exist: ``ENOENT``, exit 1;
    nothing changed."""
    before = snapshot(settled.storage)
    refused = settled.ctx("session", *[w.format(uid=settled.uid) for w in argv])
    assert refused.rc == rc and refused.out == "", refused
    last = refused.err.splitlines()[-1]
    assert last.startswith(said.format(uid=settled.uid)), refused
    if said.startswith("ctx: EINVAL: Invalid value"):
        assert refused.err.startswith(f"Usage: ctx session {argv[0]} "), refused
    else:
        assert refused.err.count("\n") == 1, refused
    assert snapshot(settled.storage) == before


def test_a_damaged_identity_names_the_file_to_fix(world):
    """docs/policy.md "What the chain reads": a command that needs the agent's uid from a
    damaged ``identity`` says which file to fix: ``ctx: EACCES: cannot tell agent 'coder''s
    uid: …; fix agent/coder.d/identity, or give --uid`` (exit 1), the damage in plain words;
    the chain denies at step 1 naming it."""
    (world.storage / "agent" / "coder.d" / "identity").write_bytes(b'{"uid": 6\x00}')
    for command in ("show", "list"):
        refused = world.ctx("session", command, "coder")
        assert (refused.rc, refused.out) == (1, ""), refused
        assert refused.err == (
            "ctx: EACCES: cannot tell agent 'coder''s uid: agent/coder.d/identity is invalid: "
            "not JSON: it holds a NUL byte (byte 9), so it is not text; fix "
            "agent/coder.d/identity, or give --uid\n"
        ), refused
    explained = world.ctx("policy", "explain", "coder", "tool:t", "execute")
    assert explained.rc == 1, explained
    assert explained.out.splitlines()[-1] == (
        "deny: EACCES: step 1 (peer credentials): agent/coder.d/identity is invalid: not JSON: "
        "it holds a NUL byte (byte 9), so it is not text"
    ), explained


@pytest.mark.parametrize("kind", ["fifo", "hard-link"])
def test_an_events_file_that_is_not_a_regular_file_of_one_name_is_refused(world, kind):
    """S-5, docs/sessions.md: a FIFO at ``events.jsonl`` is ``EINVAL`` ("is not a regular
    file") for every reader and repair, and for a call (stage ``session``); an
    ``events.jsonl`` with more than one name is neither appended to nor repaired (``EINVAL:
    … is a file with 2 names (hard links); refusing to …``), the file unchanged."""
    session = world.session_dir("s")
    session.mkdir(parents=True)
    for d in (session, *list(session.parents)[:3]):
        os.chown(d, world.uid, world.uid)
        d.chmod(0o700)
    events = session / "events.jsonl"
    other = world.top / "elsewhere.txt"
    if kind == "fifo":
        os.mkfifo(events)
        fragment, commands = "is not a regular file", ("show", "tail", "repair")
    else:
        other.write_text('{"ts":"2026-01-01T00:00:00Z","type":"x"}\n{"ts":"2026')
        os.link(other, events)
        fragment, commands = "is a file with 2 names (hard links)", ("repair",)
    kept = other.read_bytes() if kind == "hard-link" else b""
    for command in commands:
        refused = world.ctx("session", command, "coder", "s", timeout=20)
        assert refused.rc == 1, refused
        assert refused.err.splitlines()[-1].startswith(f"ctx: EINVAL: {events} {fragment}")
    terminal = world.ctx("run", "--agent", "coder", "--session", "s", "t", timeout=20)
    assert terminal.rc == 126, terminal
    assert terminal.err == f"ctx: EINVAL: {events} {fragment}; refusing to append to it\n"
    frame = result_frame(world.native("t", "{}", "--session", "s", timeout=20))
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EINVAL", "session"), frame
    assert not world.marker("t").exists()
    if kind == "hard-link":
        assert other.read_bytes() == kept


def test_a_call_into_a_shared_session_is_refused_without_making_anything(world):
    """S-6, docs/sessions.md: a session in a shared space needs the space, its ``agent/``
    directory (``ENOENT`` otherwise) and ``shared:<space> write`` through the whole chain (an
    agent that may only read the space: ``EACCES`` naming the denying step, nothing created
    under ``shared/<space>/agent/``); a directory another member made at ``agent/<agent>/``
    is ``EACCES`` naming it and its owner."""
    with (world.storage / "agent" / "coder.d" / "policy").open("a") as policy:
        policy.write("allow coder_t shared:ro read\n")
        for space in ("noagent", "planted"):
            policy.write(f"allow coder_t shared:{space} read\nallow coder_t shared:{space} write\n")
    for space in ("ro", "noagent", "planted"):
        made = world.ctx("shared", "create", space, "--group", str(world.uid))
        assert made.rc == 0, made
    (world.storage / "shared" / "noagent" / "agent").rmdir()
    planted = world.storage / "shared" / "planted" / "agent" / "coder"
    planted.mkdir()
    os.chown(planted, 4242, world.uid)
    planted.chmod(0o3770)
    before = snapshot(world.storage / "shared")
    ro = result_frame(world.native("t", "{}", "--project", "ro"))
    assert (ro["error"]["error"], ro["error"]["stage"], ro["error"]["step"]) == (
        "EACCES",
        "session",
        3,
    ), ro
    assert ro["error"]["message"].startswith("step 3 (mount visibility): shared/ro "), ro
    cases = {
        "noagent": "ctx: ENOENT: shared space 'noagent' has no agent/ directory",
        "planted": f"ctx: EACCES: {planted} belongs to uid 4242, not to agent 'coder'",
        "nospace": "ctx: ENOENT: ",
    }
    for space, said in cases.items():
        refused = world.terminal("t", options=("--project", space))
        assert refused.rc == 126 and refused.err.startswith(said), refused
    assert snapshot(world.storage / "shared") == before
    assert not world.marker("t").exists()


# ------------------------------------------------------------------------------ ctx tool


def test_ctx_tool_refuses_what_is_not_a_safe_core_cli_and_logs_its_refusals(world):
    """H-3, H-4, docs/tools.md "ctx tool": ordinary tools and the core tools that act with an
    agent's permissions are ``EACCES`` (exit 1), a name not on ``CTX_PATH`` ``ENOENT`` (exit
    1); an update giving a key twice, or a value past its bound, is ``EINVAL``, exit 2, and
    not one setting changes; a ``tsh.config`` whose status is not available is ``EACCES``,
    and its log gets a ``tool_result`` line, mode ``host``, ``exit_status`` null, the
    refusal's errno."""
    for name, said in (
        ("fs.write", "ctx: EACCES: fs.write is a core tool that acts with an agent's permissions"),
        ("shell.exec", "ctx: EACCES: shell.exec is a core tool that acts with an agent's"),
        ("t", "ctx: EACCES: t is an ordinary tool"),
        ("nosuch", "ctx: ENOENT: nosuch is not on CTX_PATH"),
    ):
        refused = world.ctx("tool", name)
        assert (refused.rc, refused.out) == (1, ""), refused
        assert refused.err.startswith(said), refused
    config = world.storage / "tool" / "tsh.d" / "config"
    kept = config.read_bytes()
    twice = world.ctx("tool", "tsh.config", "cache_capacity=64", "cache_capacity=65")
    assert twice.rc == 2 and twice.err.startswith("ctx: EINVAL: "), twice
    over = world.ctx("tool", "--json", "tsh.config", "window_percent=2", "cache_capacity=65537")
    assert over.rc == 2 and over.json()["error"] == "EINVAL", over
    assert config.read_bytes() == kept
    (world.tool_dir("tsh.config") / "status").write_text("disabled\n")
    disabled = world.ctx("tool", "tsh.config")
    assert disabled.rc == 1, disabled
    assert disabled.err.startswith("ctx: EACCES: tool tsh.config is not available"), disabled
    line = read_jsonl(world.tool_dir("tsh.config") / "log")[-1]
    assert (line["type"], line["mode"], line["agent"], line["session"]) == (
        "tool_result",
        "host",
        "",
        "",
    ), line
    assert (line["exit_status"], line["errno"], line["uid"]) == (None, "EACCES", 0), line


# ------------------------------------------------------------------------------ Python callers


API_SCRIPT = """
import json, sys
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from cortexfs.tools.runner import run_native

root, uid = sys.argv[1], int(sys.argv[2])
out = {}
for label, timeout in (("zero", 0), ("past-a-year", 31622401), ("nan", float("nan"))):
    r = run_native(root, "coder", "t", {}, timeout=timeout)
    out[label] = [r.ok, r.error.errno, r.error.stage]
r = run_native(root, "coder", "t", {}, session=SessionRef.home(root, uid, "other", "s1"))
out["other-agent"] = [r.ok, r.error.errno, r.error.stage]
refused = {}
try:
    SessionRef.home(root, 4294967295, "coder", "s")
except Exception as exc:
    refused["uid"] = getattr(exc, "errno", None)
with open_session(SessionRef.home(root, uid, "coder", "api"), owner=Ownership(uid, uid)) as s:
    for label, facts in (("nan", {"v": float("nan")}), ("big", {"v": "a" * 70000})):
        try:
            s.record("x", object="o", status="ok", **facts)
        except Exception as exc:
            refused[label] = getattr(exc, "errno", None)
    try:
        s.record("x", object="o", status="ok", ts="now")
    except TypeError:
        refused["ts"] = "TypeError"
    s.record("x", object="o", status="ok", v=1)
out["refused"] = refused
print(json.dumps(out))
"""


def test_python_callers_are_refused_with_the_documented_errno_and_nothing_appended(world):
    """docs/tools.md "For workers and other callers" and docs/sessions.md: ``run_native``'s
    ``timeout`` must be above 0 and at most a year and a day, else ``EINVAL`` at stage
    ``caller`` before anything is recorded; a ``SessionRef`` of another agent is
    ``EINVAL``, and one of a uid past 4294967294; ``record`` refuses NaN (``EINVAL``) and an
    event over 64 KiB (``EFBIG``), appending nothing, and a fact named ``ts`` is a
    ``TypeError``."""
    done = subprocess.run(
        [PYTHON, "-c", API_SCRIPT, str(world.storage), str(world.uid)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for label in ("zero", "past-a-year", "nan"):
        assert out[label] == [False, 22, "caller"], out
    assert out["other-agent"] == [False, 22, "session"], out
    assert out["refused"] == {"uid": 22, "nan": 22, "big": 27, "ts": "TypeError"}, out
    assert call_events(world) == []
    assert not (world.storage / "home" / str(world.uid) / "agent" / "other").exists()
    assert [(e["type"], e["v"]) for e in world.events("api")] == [("x", 1)]
    assert not world.marker("t").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "--flows=all", "-q"]))
