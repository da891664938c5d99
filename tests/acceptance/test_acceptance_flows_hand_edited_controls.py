"""Flows of an administrator who edits CortexFS's control files by hand (SPEC §1 R-5, §2.4
``queue/config``, §5 P-1..P-6, §6 T-1, T-6, T-8, §7 H-4, §8 A-3): after ``ctx bootstrap``,
``ctx object install`` and ``ctx agent create``, the controls of a tool (``tool/<name>.d/``), of
an agent (``agent/<name>.d/``), a queue's ``config`` and ``tool/tsh.d/config`` are rewritten
with an editor or a shell — values of the wrong type, lines appended instead of replaced,
CRLF line ends, a byte order mark, NUL and invalid UTF-8, terminal escapes, the control left as
a directory, a FIFO or a link — and every command that reads them (``ctx run`` in both modes,
``ctx policy explain``, ``ctx agent show/list``, ``ctx object list``, ``ctx queue …``,
``ctx tool tsh.config``, ``ctx bootstrap``) is asked about each.  What must hold: a clear
error with an errno that names the file at fault, or a documented default; no traceback, no
hang, nothing run that a damaged control should have stopped, nothing half-changed."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import OnStorage, Run, clean_env, ctx_run, scratch_top

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

SCRATCH = scratch_top(__file__)
TOOL = "demo.edit"
AGENT = "coder"
LABEL = "coder_t"
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}
# One trace line per run, so that a refused call provably ran nothing.
PROGRAM = '#!/bin/sh\necho "ran $*" >> {trace}\necho "ran $*"\n'
RAW_CONTROLS = ("\x1b", "\x07", "\x00")


@dataclass
class Desk(OnStorage):
    """A bootstrapped root every uid may search, tool ``demo.edit`` in the system tier and
    agent ``coder`` (uid nobody, a workspace at ``/workspace``) allowed it in both layers of
    P-6; ``top`` holds the tool's source, the workspace and the trace."""

    storage: Path
    top: Path

    @property
    def trace(self) -> Path:
        return self.top / "trace"

    @property
    def workspace(self) -> Path:
        return self.top / "ws"

    def ran(self) -> list[str]:
        return self.trace.read_text().splitlines() if self.trace.exists() else []

    def tool_control(self, name: str) -> Path:
        return self.storage / "tool" / f"{TOOL}.d" / name

    def agent_control(self, name: str) -> Path:
        return self.storage / "agent" / f"{AGENT}.d" / name

    def replace(self, path: Path, content: bytes | str, mode: int = 0o644) -> None:
        """What an editor or a shell leaves at ``path``: bytes, or ``dir``, ``fifo``, or
        ``link`` (to a copy of what was there, kept in ``top``)."""
        kept = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if isinstance(content, bytes):
            path.write_bytes(content)
            path.chmod(mode)
        elif content == "dir":
            path.mkdir()
        elif content == "fifo":
            os.mkfifo(path)
        elif content == "link":
            fd, copy = tempfile.mkstemp(prefix=f"copy-{path.name}-", dir=self.top)
            os.write(fd, kept)
            os.close(fd)
            path.symlink_to(copy)
        else:
            raise AssertionError(f"no such edit: {content!r}")

    def terminal(self, *argv: str) -> Run:
        return self.ctx("run", "--agent", AGENT, TOOL, *argv)

    def native(self, value: object, tool: str = TOOL) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", AGENT, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def listed(self) -> dict:
        r = self.ctx("object", "list", "--json")
        assert r.rc == 0, r
        [entry] = [t for t in r.json() if t["name"] == TOOL]
        return entry

    def shown(self) -> dict:
        r = self.ctx("agent", "show", AGENT, "--json")
        assert r.rc == 0, r
        return r.json()


def manifest(top: Path) -> Path:
    """The v2 manifest of ``demo.edit`` (T-8), its program beside it."""
    src = top / "src" / TOOL
    src.mkdir(parents=True, exist_ok=True)
    (src / "prog.sh").write_text(PROGRAM.format(trace=top / "trace"))
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": TOOL,
        "description": f"{TOOL}: echoes its arguments.",
        "schema": SCHEMA,
        "cap": {"side_effects": False, "network": False},
        "exec": "prog.sh",
    }
    path = src / "manifest.json"
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def desk(searchable_storage: Path) -> Iterator[Desk]:
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="desk-", dir=SCRATCH))
    top.chmod(0o1777)  # the agent's tool leaves its trace here
    d = Desk(searchable_storage, top)
    try:
        d.workspace.mkdir(mode=0o755)
        installed = d.ctx("object", "install", manifest(top), "--tier", "system")
        assert installed.rc == 0, installed
        request = {
            "name": AGENT,
            "label": LABEL,
            "tools": [TOOL],
            "mount": [[str(d.workspace), "/workspace", "rw"]],
        }
        made = d.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made
        with open(d.tool_control("policy"), "a") as policy:
            policy.write(f"allow {LABEL} tool:{TOOL} execute\n")
        yield d
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def bare(storage: Path) -> Iterator[Desk]:
    """A bootstrapped root holding the queue of project ``proj`` and nothing else of ours: no
    tool installed, no agent (for the files only commands of the host read)."""
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    top = Path(tempfile.mkdtemp(prefix="bare-", dir=SCRATCH))
    try:
        yield Desk(storage, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def assert_clean_refusal(r: Run, errno: str, *named: str) -> None:
    """``ctx run`` in terminal mode refused before running: exit 126, ``ctx: ERRNO: …`` on
    stderr naming each of ``named``, no traceback."""
    assert r.rc == 126 and r.out == "", r
    assert r.err.startswith(f"ctx: {errno}: "), r
    assert "Traceback" not in r.err, r
    for word in named:
        assert word in r.err, (word, r)


# ====================================================================== agent controls


IDENTITY_EDITS = {
    "uid left out": b'{"gid": 65534, "groups": []}',
    "uid negative": b'{"uid": -1, "gid": 65534, "groups": []}',
    "uid a string": b'{"uid": "65534", "gid": 65534, "groups": []}',
    "uid (uid_t)-1": b'{"uid": 4294967295, "gid": 65534, "groups": []}',
    "uid given twice": b'{"uid": 65534, "gid": 65534, "groups": [], "uid": 0}',
    "a NUL": b'{"uid": 65534, "gid": 65534, "groups": []}\x00',
    "invalid UTF-8": b'{"uid": 65534, "gid": 65534, "groups": [], "x": "\xff"}',
    "a FIFO": "fifo",
}


def test_a_hand_edited_identity_refuses_every_call_naming_the_file_and_never_waits(desk):
    """A-3, P-5 step 1: ``agent/coder.d/identity`` rewritten with a uid left out, negative,
    a string, ``(uid_t)-1``, given twice (the second ``0``), holding a NUL or
    invalid UTF-8, or replaced by a FIFO (never waited on):
    ``ctx run`` refuses with ``EACCES`` naming the file before anything runs, ``ctx agent list``
    names the same problem and no identity, and neither prints a traceback."""
    d = desk
    identity = d.agent_control("identity")
    for n, (what, content) in enumerate(IDENTITY_EDITS.items()):
        d.replace(identity, content)
        refused = d.terminal("x")
        assert_clean_refusal(refused, "EACCES", "agent/coder.d/identity")
        if n % 3 == 0:  # a third of them: the listing says what the call said
            listed = d.ctx("agent", "list", "--json")
            assert listed.rc == 0, (what, listed)
            [entry] = [a for a in listed.json() if a["name"] == AGENT]
            assert entry["identity"] is None and entry["problems"], (what, entry)
            assert "agent/coder.d/identity" in entry["problems"][0], (what, entry)
    assert d.ran() == [], "a call ran with a damaged identity"
    d.replace(identity, b'{"uid": 65534, "gid": 65534, "groups": [65534]}\n')
    assert d.terminal("again").out == "ran again\n"


MOUNT = "agent/coder.d/mount"
POLICY = "agent/coder.d/policy"
LABEL_FILE = "agent/coder.d/label"


def agent_edits(d: Desk) -> list[tuple[str, str, int, bytes | str]]:
    """(control, named in the refusal, step of the chain, what is written)."""
    ws = str(d.workspace)
    root = str(d.storage)
    policy = d.agent_control("policy").read_bytes()

    def table(*rows: list[str]) -> bytes:
        return json.dumps([*rows, [root, "/ctx", "ro"]]).encode()

    return [
        ("label", LABEL_FILE, 4, b"coder_t\nroot_t\n"),
        ("label", LABEL_FILE, 4, b"\xef\xbb\xbfcoder_t\n"),
        ("policy", POLICY, 5, policy + b"allow coder_t tool:* execute\n"),
        ("policy", POLICY, 5, policy.replace(b"\n", b"\r\n")),
        ("mount", MOUNT, 3, table(["workspace", "/workspace", "rw"])),
        ("mount", MOUNT, 3, table([ws + "/../ws", "/workspace", "rw"])),
        ("mount", MOUNT, 3, table([ws, "/workspace", "rwx"])),
        ("mount", MOUNT, 3, b'[["/w", "/workspace", "rw"],]'),
        ("mount", MOUNT, 3, "link"),
    ]


def test_a_hand_edited_label_policy_or_mount_table_grants_nothing_and_says_why(desk):
    """A-3, P-1..P-5: the label given two lines or a byte order mark; the policy given a
    glob line or CRLF line ends; the mount table given a relative
    source, ``..`` in a source, an unknown mode, a trailing comma, or left a link.  Every
    call is refused with ``EACCES`` at the step that reads the control (4, 5 or 3), naming the
    file, ``ctx policy explain`` gives the same step, ``ctx agent show`` lists the problem,
    and nothing runs: an invalid control grants nothing (P-2).  A workspace directory the
    first mount names, moved away, is ``ENOENT`` naming it and the mount table (A-1)."""
    d = desk
    explained_steps = set()
    for control, named, step, content in agent_edits(d):
        path = d.agent_control(control)
        good = path.read_bytes()
        d.replace(path, content)
        refused = d.terminal("x")
        assert_clean_refusal(refused, "EACCES", f"step {step} ", named)
        problems = d.shown()["problems"]
        assert any(named in p for p in problems), (content, problems)
        if step not in explained_steps:  # once per control: the chain says what the run said
            explained_steps.add(step)
            why = d.ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute", "--json")
            assert why.rc == 1, (content, why)
            assert (why.json()["step"], why.json()["errno"]) == (step, "EACCES"), why
            assert named in why.json()["reason"], (content, why)
        d.replace(path, good)

    # The workspace the first mount names, moved away behind the agent's back.
    d.workspace.rename(d.top / "ws-aside")
    refused = d.terminal("x")
    assert_clean_refusal(refused, "ENOENT", str(d.workspace), MOUNT)
    (d.top / "ws-aside").rename(d.workspace)
    assert d.ran() == []
    assert d.terminal("again").out == "ran again\n"


def test_a_mount_source_that_is_a_file_is_not_called_missing(desk):
    """A-3, A-1: the administrator points the workspace mount of ``agent/coder.d/mount`` at
    a regular file.  The refusal must say what is wrong with the path it names — that it is
    not a directory — not that it does not exist (it does): ``ENOTDIR`` or a refusal of the
    mount, never ``ENOENT``, and nothing runs."""
    d = desk
    note = d.top / "notes.txt"
    note.write_text("not a directory\n")
    table = [[str(note), "/workspace", "rw"], [str(d.storage), "/ctx", "ro"]]
    d.replace(d.agent_control("mount"), json.dumps(table).encode())
    refused = d.terminal("x")
    assert refused.rc == 126 and "Traceback" not in refused.err, refused
    assert str(note) in refused.err, refused
    assert not refused.err.startswith("ctx: ENOENT"), refused
    assert "does not exist" not in refused.err, refused
    assert d.ran() == []


# ====================================================================== tool controls


# (control, what is written); the problem ``ctx object list`` lists names the control.
TOOL_EDITS = [
    ("schema", b'{"type": "objekt"}'),
    ("schema", b'{"$ref": "file:///etc/passwd"}'),
    ("schema", b'{"type": "object", "type": "string"}'),
    ("cap", b"[]"),
    ("name", b"other\n"),
    ("log", "fifo"),
]


def test_a_hand_edited_tool_control_makes_it_damaged_until_a_reinstall_keeping_local_state(
    desk,
):
    """T-1, T-8, T-8a: the tool's schema rewritten as an invalid JSON Schema, a ``$ref`` out
    of itself, with a key given twice; its cap an array; its name another tool's; its log a
    FIFO.  ``ctx object list`` calls it damaged naming the control, a native call is refused
    with ``ENOEXEC`` at stage ``resolve`` naming it and the reinstall, and nothing runs.  A
    reinstall from the manifest heals the last damage and keeps what is the administrator's:
    the policy's grant, a ``disabled`` status, a file of their own in the control directory
    (T-1 names no ``timeout``: it is kept, not obeyed)."""
    d = desk
    for control, content in TOOL_EDITS:
        path = d.tool_control(control)
        good = path.read_bytes()
        d.replace(path, content)
        entry = d.listed()
        assert entry["status"] == "damaged", (control, content, entry)
        assert any(control in p for p in entry["problems"]), (control, content, entry)
        r, result = d.native({"n": 1})
        assert r.rc == 1 and result["output"] is None, (control, content, r)
        error = result["error"]
        assert (error["error"], error["stage"]) == ("ENOEXEC", "resolve"), (content, error)
        assert control in error["message"] and "--tier system" in error["message"], error
        assert "Traceback" not in r.err
        d.replace(path, good)
    assert d.ran() == []

    d.replace(d.tool_control("schema"), b"{")
    (d.tool_control("timeout")).write_text("5\n")
    d.replace(d.tool_control("status"), b"disabled\n")
    grant = d.tool_control("policy").read_bytes()
    reinstalled = d.ctx("object", "install", manifest(d.top), "--tier", "system")
    assert reinstalled.rc == 0, reinstalled
    assert json.loads(d.tool_control("schema").read_text()) == SCHEMA
    assert d.tool_control("timeout").read_text() == "5\n"
    assert d.tool_control("policy").read_bytes() == grant
    assert (d.listed()["status"], d.listed()["problems"]) == ("disabled", [])
    d.replace(d.tool_control("status"), b"available\n")
    assert d.terminal("healed").out == "ran healed\n"


def test_a_schema_that_cannot_be_applied_is_named_not_an_io_error(desk):
    """T-1, T-8 (``schema``: a valid JSON Schema), docs/tools.md stage ``schema``: the
    administrator writes a ``pattern`` that is no regular expression (``(``), or a schema that
    refers to itself (``{"$ref": "#"}``).  No input can be checked against either, so the tool
    is damaged (``ctx object list`` names the schema) or the call is refused with an errno
    that says so — never ``EIO`` with ``error: missing ), …`` or ``RecursionError: …``, which
    name neither the tool nor the control — and nothing runs."""
    d = desk
    bad_pattern = {"type": "object", "properties": {"n": {"type": "string", "pattern": "("}}}
    for schema in (bad_pattern, {"$ref": "#"}):
        d.replace(d.tool_control("schema"), json.dumps(schema).encode())
        r, result = d.native({"n": "text"})
        assert result["status"] == "error" and "Traceback" not in r.err, r
        error = result["error"]
        assert error["error"] != "EIO", (schema, error)
        assert "schema" in error["message"] and TOOL in error["message"], (schema, error)
        for python_error in ("error: ", "RecursionError"):
            assert not error["message"].startswith(python_error), (schema, error)
    assert d.ran() == []


def test_disabled_appended_to_the_status_control_switches_the_tool_off(desk):
    """T-1 and docs/tools.md ``status``: a call is refused (``EACCES``) unless the control
    reads ``available``.  An administrator who appends ``disabled`` (``echo disabled >>
    status``) instead of replacing the line leaves a control that does not read
    ``available``: the tool must not run, in either mode, and ``ctx object list`` must not
    call it available — the first line alone must not decide (fail closed)."""
    d = desk
    with open(d.tool_control("status"), "a") as status:
        status.write("disabled\n")
    assert d.tool_control("status").read_text() == "available\ndisabled\n"
    refused = d.terminal("x")
    assert refused.rc == 126 and refused.err.startswith("ctx: EACCES: "), refused
    r, result = d.native({"n": 1})
    assert result["status"] == "error" and result["error"]["error"] == "EACCES", r
    assert d.listed()["status"] != "available"
    assert d.ran() == []


def test_a_refusal_quoting_a_hand_edited_control_reaches_the_terminal_escaped(desk):
    """T-1, A-3, docs/tools.md (``what it quotes is escaped, as every message is``): a status
    control ``unavailable: <reason>`` whose reason was pasted with terminal escapes, and a
    mount source holding one.  ``ctx object list`` and ``ctx agent show`` escape them; the
    refusal ``ctx run`` prints on stderr must too — no ESC or BEL byte reaches the terminal
    — while the native frame keeps the text exactly (JSON escapes it).  T-6: so must the veto
    of a guard the administrator wrote, which quotes what it refused (a hook's message is the
    last line of its stderr)."""
    d = desk
    reason = "maintenance\x1b]0;owned\x07\x1b[2J"
    d.replace(d.tool_control("status"), f"unavailable: {reason}\n".encode())
    listed = d.ctx("object", "list")
    assert listed.rc == 0 and not any(c in listed.out for c in RAW_CONTROLS), listed
    _, result = d.native({"n": 1})
    assert reason in result["error"]["message"], result
    refused = d.terminal("x")
    assert refused.rc == 126 and "maintenance" in refused.err, refused
    assert not any(c in refused.err for c in RAW_CONTROLS), refused

    d.replace(d.tool_control("status"), b"available\n")
    good_table = d.agent_control("mount").read_bytes()
    odd = str(d.workspace) + "\x1b[2J"
    table = [[odd, "/workspace", "rw"], [str(d.storage), "/ctx", "ro"]]
    d.replace(d.agent_control("mount"), json.dumps(table).encode())
    shown = d.ctx("agent", "show", AGENT)
    assert shown.rc == 0 and "\x1b" not in shown.out, shown
    refused = d.terminal("x")
    assert refused.rc == 126 and "mount" in refused.err, refused
    assert "\x1b" not in refused.err, refused

    d.replace(d.agent_control("mount"), good_table)
    guard = b'#!/bin/sh\nprintf "refused \\033]0;owned\\007\\033[2J here\\n" >&2\nexit 3\n'
    d.replace(d.tool_control("hooks/pre.d/10-guard"), guard, mode=0o755)
    refused = d.terminal("x")
    assert refused.rc == 126 and "hooks/pre.d/10-guard" in refused.err, refused
    assert "refused" in refused.err, refused
    assert not any(c in refused.err for c in RAW_CONTROLS), refused
    assert d.ran() == []


def test_pre_hooks_an_editor_left_behind_are_judged_as_documented(desk):
    """T-6, docs/tools.md "Hooks": in ``hooks/pre.d/`` a ``README`` (no execute bit) is no
    hook, a guard saved with CRLF line ends (its ``#!/bin/sh\\r`` names no interpreter) is a
    failed hook and so a veto (``EACCES`` naming it, nothing runs), and with the guard's
    line ends fixed the call runs again."""
    d = desk
    pre = d.tool_control("hooks/pre.d")
    d.replace(pre / "README", b"Guards of demo.edit.\n")
    assert d.terminal("readme").out == "ran readme\n"
    d.replace(pre / "10-guard", b"#!/bin/sh\r\nexit 0\r\n", mode=0o755)
    refused = d.terminal("x")
    assert_clean_refusal(refused, "EACCES", "hooks/pre.d/10-guard")
    r, result = d.native({"n": 1})
    assert (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "hook"), r
    d.replace(pre / "10-guard", b"#!/bin/sh\nexit 0\n", mode=0o755)
    assert d.terminal("fixed").out == "ran fixed\n"
    assert d.ran() == ["ran readme", "ran fixed"]


# ====================================================================== queue/config


def queue_of(d: Desk) -> tuple[Path, Callable[..., Run]]:
    """The config of project ``proj``'s queue, and ``ctx queue COMMAND --project proj``."""

    def queue(command: str, *args: str, input: str | None = None) -> Run:
        return d.ctx("queue", command, "--project", "proj", *args, input=input)

    return d.storage / "shared" / "proj" / "queue" / "config", queue


def test_queue_config_hand_edits_are_refused_by_line_or_read_as_documented(bare):
    """§2.1 (size limit in ``queue/config``), docs/queue.md "Configuration": a config saved
    with CRLF line ends and trailing blanks is read (``max_request_bytes=40`` holds: a 41-byte
    request is ``EFBIG``); a key given again counts from there on; an empty config is the
    defaults.  A byte order mark, an unknown key, a NUL, invalid UTF-8 in a value, ``0`` and
    ``0x10`` are ``EINVAL`` naming ``config:LINE`` (publish, status, claim alike), the offending
    text escaped, and nothing is published or claimed."""
    d = bare
    config, queue = queue_of(d)
    request = json.dumps({"tool": "fs.read", "input": {"p": "xx"}})  # 41 bytes
    assert len(request) == 41
    d.replace(config, b"max_request_bytes=40  \r\n# comment\t\r\ngrace=5 \r\n")
    big = queue("publish", "-", input=request)
    assert big.rc == 1 and big.err.startswith("ctx: EFBIG: "), big
    d.replace(config, b"max_request_bytes=40\nmax_request_bytes=41\n")
    assert queue("publish", "-", input=request).rc == 0
    d.replace(config, b"max_request_bytes=41\nmax_request_bytes=40\n")
    assert queue("publish", "-", input=request).rc == 1
    d.replace(config, b"")
    assert queue("publish", "-", input=request).rc == 0

    pending = sorted(os.listdir(config.parent / "pending"))
    refused_edits = [
        (b"\xef\xbb\xbfmax_request_bytes=100\n", 1, "\\ufeff"),
        (b"grace=5\nmax_request_byte=100\n", 2, "max_request_byte"),
        (b"max_request_bytes=10\x000\n", 1, "\\x00"),
        (b"# ok\n\nmax_request_bytes=1\xff0\n", 3, "max_request_bytes"),
        (b"max_request_bytes=0\n", 1, "'0'"),
        (b"max_request_bytes=0x10\n", 1, "'0x10'"),
    ]
    for n, (content, line, quoted) in enumerate(refused_edits):
        d.replace(config, content)
        command, args = [("publish", ("-",)), ("status", ()), ("claim", ())][n % 3]
        r = queue(command, *args, input=request)
        assert r.rc == 1 and r.out == "", (content, r)
        assert r.err.startswith(f"ctx: EINVAL: {config}:{line}: "), (content, r)
        assert quoted in r.err and "\x00" not in r.err, (content, r)
    assert sorted(os.listdir(config.parent / "pending")) == pending


def test_key_value_files_count_lines_as_an_editor_does(bare):
    """docs/queue.md "Configuration" (``unknown keys are refused with EINVAL and the line
    number``; ``#`` comments), H-4: a ``queue/config`` with a form feed on a line of its own
    (a page break, ``^L``) reports a bad value on the line ``grep -n`` and an editor show it
    on; a comment holding a vertical tab stays a comment whole — the setting written after
    the ``^K`` is not applied; and ``tool/tsh.d/config`` numbers its lines the same way."""
    d = bare
    config, queue = queue_of(d)
    d.replace(config, b"# limits\n\x0c\nmax_request_bytes=ten\n")
    refused = queue("status")
    assert refused.rc == 1, refused
    assert refused.err.startswith(f"ctx: EINVAL: {config}:3: "), refused

    d.replace(config, b"# max_request_bytes=10 was too small\x0bmax_request_bytes=10\n")
    published = queue("publish", "-", input=json.dumps({"tool": "fs.read", "input": {}}))
    assert published.rc == 0, published

    tsh_config = d.storage / "tool" / "tsh.d" / "config"
    d.replace(tsh_config, b"# tuning\n\x0c\nmax_loaded_tools=many\n")
    read = tsh_tool(d)
    assert "tsh.d/config:3: " in read.err, read


# ====================================================================== tool/tsh.d/config


def tsh_tool(d: Desk, *args: str) -> Run:
    env = clean_env(
        CTX_STORAGE=str(d.storage), CTX_PATH=str(d.storage / "tool"), CTX_HOME=str(d.top)
    )
    return ctx_run("tool", "tsh.config", *args, env=env)


TSH_DEFAULTS = "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n"


def test_a_hand_edited_tsh_config_warns_by_line_and_is_never_rewritten_over(bare):
    """H-4, H-3, R-5: ``tool/tsh.d/config`` edited by hand with a key given twice, a byte
    order mark or a NUL.
    Reading it (``ctx tool tsh.config``) warns naming ``tsh.d/config:LINE`` and prints the
    defaults that then apply; an update is refused (``EINVAL``, fix it by hand first) and
    leaves the file as it was; ``ctx bootstrap`` reports it as a problem (exit 1) and never
    rewrites it.  A config left empty is the defaults, and an update writes the one key."""
    d = bare
    config = d.storage / "tool" / "tsh.d" / "config"
    edits = [
        (b"max_loaded_tools=64\nmax_loaded_tools=8\n", 2),
        (b"\xef\xbb\xbfmax_loaded_tools=8\n", 1),
        (b"max_loaded_tools=6\x004\n", 1),
    ]
    for content, line in edits:
        d.replace(config, content)
        read = tsh_tool(d)
        assert read.rc == 0 and read.out == TSH_DEFAULTS, (content, read)
        assert f"tsh.d/config:{line}: " in read.err and "\x00" not in read.err, (content, read)
        update = tsh_tool(d, "cache_capacity=16")
        assert update.rc == 1 and update.err.startswith("ctx: EINVAL: "), (content, update)
        assert "Traceback" not in update.err
        assert config.read_bytes() == content
    boot = ctx_run("bootstrap", "--storage", d.storage, "--json")
    assert boot.rc == 1, boot
    assert [p for p in boot.json()["problems"] if "tool/tsh.d/config:1: " in p], boot
    assert config.read_bytes() == content

    d.replace(config, b"")
    assert tsh_tool(d).out == TSH_DEFAULTS
    assert tsh_tool(d, "cache_capacity=16").rc == 0
    assert config.read_text() == "cache_capacity=16\n"


def test_a_tsh_config_update_keeps_the_administrators_comment_bytes(bare):
    """H-4, docs/tools.md (``tsh.config``: an update rewrites the file atomically and keeps
    its comments): a comment saved in Latin-1 (``# réglé``, ``\\xe9``) by an old editor is
    data the administrator wrote.  Updating one setting changes that setting's line and
    nothing else: the comment's bytes are kept as they were, not replaced by U+FFFD."""
    d = bare
    config = d.storage / "tool" / "tsh.d" / "config"
    d.replace(config, b"# r\xe9gl\xe9 par l'admin\nmax_loaded_tools=64\ncache_capacity=32\n")
    update = tsh_tool(d, "cache_capacity=16")
    assert update.rc == 0, update
    assert (
        config.read_bytes()
        == b"# r\xe9gl\xe9 par l'admin\nmax_loaded_tools=64\ncache_capacity=16\n"
    )


# ====================================================================== ctx bootstrap


def test_bootstrap_puts_back_a_hand_edited_core_tool_and_keeps_the_administrators_state(desk):
    """R-5, T-1, P-6: a core tool's controls edited by hand — ``fs.stat``'s schema weakened
    to ``{}``, its description rewritten, its cap replaced by a link — while the agent is
    granted it.  The weakened schema lets no invalid input through (the core tool checks its
    own input).  ``ctx bootstrap`` says ``repaired  tool/fs.stat``, puts schema, description
    and cap back as a fresh root has them, and keeps the policy's grant, a ``disabled``
    status, a pre-hook and a file of the administrator's: the tool is listed ``disabled``,
    with no problem."""
    d = desk
    controls = d.storage / "tool" / "fs.stat.d"
    with open(controls / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:fs.stat execute\n")
    with open(d.agent_control("policy"), "a") as policy:
        policy.write(f"allow {LABEL} tool:fs.stat execute\n")
    pristine = {n: (controls / n).read_bytes() for n in ("schema", "description", "cap")}
    grant = (controls / "policy").read_bytes()

    d.replace(controls / "schema", b"{}")
    d.replace(controls / "description", b"Stats anything, anywhere.\n")
    r, result = d.native({"path": "/workspace", "bogus": True}, tool="fs.stat")
    assert result["status"] == "error" and result["error"]["error"] == "EINVAL", r
    assert "bogus" in result["error"]["message"] and "Traceback" not in r.err, result

    d.replace(controls / "cap", "link")

    d.replace(controls / "status", b"disabled\n")
    d.replace(controls / "notes", b"ask before enabling\n")
    guard = controls / "hooks" / "pre.d" / "10-guard"
    d.replace(guard, b"#!/bin/sh\nexit 0\n", mode=0o755)
    boot = ctx_run("bootstrap", "--storage", d.storage)
    assert boot.rc == 0, boot
    assert "repaired  tool/fs.stat" in boot.out, boot
    for name, data in pristine.items():
        assert not (controls / name).is_symlink() and (controls / name).read_bytes() == data
    assert (controls / "policy").read_bytes() == grant
    assert (controls / "status").read_text() == "disabled\n"
    assert (controls / "notes").read_text() == "ask before enabling\n"
    assert guard.read_text() == "#!/bin/sh\nexit 0\n" and os.access(guard, os.X_OK)
    [stat] = [
        t for t in json.loads(d.ctx("object", "list", "--json").out) if t["name"] == "fs.stat"
    ]
    assert (stat["status"], stat["problems"]) == ("disabled", []), stat
