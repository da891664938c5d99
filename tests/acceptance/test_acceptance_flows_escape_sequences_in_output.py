"""Text that others control, on its way to an operator's terminal: terminal control sequences
(an OSC 52 clipboard write, an OSC 8 link, an OSC title, CSI screen and cursor moves, BEL,
backspace, carriage return, NUL, DEL, the C1 control U+009B, the right-to-left override
U+202E, U+0085 and U+2028) held by request fields and results (§2.1, §2.4), a tool's stderr
quoted in a worker's reason (W-1), a pre-hook's name and message (T-6), events someone wrote
in a session (S-2, S-5), a tool's description from its manifest (T-8), a hand-edited agent
label (P-5 step 4), names found in a queue directory (Q-8), a lease another host wrote
(Q-3), an MCP server's tool names and descriptions (M-3), a storage root whose path holds
them (R-1), and the words an agent types at tsh (H-1, H-2).

The product's rule (``cortexfs/printable.py``; docs/tools.md: "whatever tsh shows that
others wrote … is shown escaped (``\\x1b``), never raw to the terminal and those watching
it"): in text mode every such character is shown as its escape, and ``--json`` stays exact
JSON, which gives the very characters back.  Each text view is read through a pipe and
through a pseudo-terminal (where ``ctx queue work`` draws a live progress line and click
strips nothing); the only controls allowed on a terminal are line ends, tabs between columns
and the progress line's own ``\\r\\x1b[K``."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
PYTHON = REPO / ".venv" / "bin" / "python"
LABEL = "coder_t"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")

# One line of what a terminal acts on (no line break of any kind in it, so that "the last
# line of stderr" is all of it).
LINE = (
    "osc52\x1b]52;c;SGVsbG8=\x07 osc8\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\ "
    "title\x1b]0;PWNED\x07 csi\x1b[2J\x1b[1;1H\x1b[31m bs\x08 del\x7f c1\u009b31m "
    "bidi\u202eevil\u202c end"
)
# The same and every line break a terminal or a splitter acts on, and NUL.
HOSTILE = LINE + " cr\r nul\x00 nel\u0085 ls\u2028 lf\n last"
# ESC as a text view spells it: as printable() does, or as JSON does (a request shown whole).
ESC = ("\\x1b", "\\u001b")


def shows_escaped(shown: str) -> bool:
    """Whether ``shown`` holds LINE's OSC 52 write, its clear-screen sequence and its
    override escaped, to be read rather than lost."""
    return (
        any(f"{esc}]52;c;SGVsbG8=" in shown for esc in ESC)
        and any(f"{esc}[2J" in shown for esc in ESC)
        and "\\u202e" in shown
    )


def acted_on(text: str) -> list[str]:
    """The characters of ``text`` a terminal acts on or that reorder what it shows: every
    control (C0, DEL, C1), format character (bidirectional overrides) and line or paragraph
    separator, but the line feed that ends a line and the tab between columns."""
    return [
        char
        for char in text
        if char not in "\n\t" and unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    ]


def terminal_text(raw: str) -> str:
    """What a pseudo-terminal gave, with its own line ends (``\\r\\n``, ONLCR) read as
    ``\\n`` and a live progress line's own redraw (``\\r\\x1b[K``) taken out."""
    return raw.replace("\r\x1b[K", "").replace("\r\n", "\n")


def octal(text: str) -> str:
    """``text`` as printf's octal escapes of its UTF-8 bytes, for a ``#!/bin/sh`` tool."""
    return "".join(f"\\{byte:03o}" for byte in text.encode())


@dataclass
class Tty:
    """A command whose stdin, stdout and stderr are one pseudo-terminal."""

    proc: subprocess.Popen
    master: int
    data: bytes = b""

    def pump(self, seconds: float = 0.2) -> bool:
        """Read what is there within ``seconds``; False at the end of the terminal."""
        ready, _, _ = select.select([self.master], [], [], seconds)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every other end closed
            return False
        self.data += chunk
        return bool(chunk)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def shows(self, wanted: str, seconds: float = 20) -> bool:
        deadline = time.monotonic() + seconds
        while wanted not in self.text() and time.monotonic() < deadline:
            if not self.pump() and wanted not in self.text():
                return False
        return wanted in self.text()

    def finish(self, seconds: float = 30) -> tuple[int, str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            alive = self.pump()
            if not alive or (self.proc.poll() is not None and not self.pump(0.05)):
                break
        try:
            rc = self.proc.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            with contextlib.suppress(OSError):
                os.close(self.master)
        return rc, self.text()


def on_tty(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Tty:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd,
        env={**env, "TERM": "xterm-256color"}, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    return Tty(proc, master)


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    uid: int
    ws: Path

    def both(self, *args: str) -> tuple[Run, str]:
        """``ctx ARGS`` read through a pipe, then through a terminal (its exit status the
        same): what each shows."""
        piped = self.ctx(*args)
        rc, shown = on_tty([*CTX_ARGV, *args], self.env).finish()
        assert rc == piped.rc, (piped, shown)
        return piped, terminal_text(shown)

    def install(self, name: str, program: str, description: str | None = None) -> None:
        manifest = tool_manifest(self.top / "manifests", name, program, description=description)
        installed = self.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        with (self.storage / "tool" / f"{name}.d" / "policy").open("a") as policy:
            policy.write(f"allow {LABEL} tool:{name} execute\n")

    def session_dir(self, session: str) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" / session


# esc.tool: HOSTILE on stdout, LINE on stderr, exit 4; veto.tool is guarded by a pre-hook
# whose name and message hold LINE's sequences.
ESC_TOOL = f"#!/bin/sh\nprintf '{octal(HOSTILE)}'\nprintf '{octal(LINE)}\\n' >&2\nexit 4\n"
HOOK_NAME = "10-veto\x1b]0;PWNED\x07\x1b[2J\u202e"
HOOK = f"#!/bin/sh\nprintf 'refused: {octal(LINE)}\\n' >&2\nexit 1\n"


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    storage = copy_of_root(_template, top / "storage")
    env = clean_env(CTX_STORAGE=str(storage))
    try:
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        request = {"name": "coder", "label": LABEL,
                   "tools": ["esc.tool", "veto.tool", "shell.exec", "tsh"]}  # fmt: skip
        made = ctx_run("agent", "create", "-", "--json", input=json.dumps(request), env=env)
        assert made.rc == 0, made
        identity = made.json()["identity"]
        os.chown(ws, identity["uid"], identity["gid"])
        world = World(top, storage, identity["uid"], ws)
        world.install("esc.tool", ESC_TOOL, description="Says " + LINE)
        world.install("veto.tool", "#!/bin/sh\necho ran\n")
        hook = storage / "tool" / "veto.tool.d" / "hooks" / "pre.d" / HOOK_NAME
        hook.write_text(HOOK)
        hook.chmod(0o755)
        for tool in ("shell.exec", "tsh"):
            with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow {LABEL} tool:{tool} execute\n")
        yield world
    finally:
        for entry in (storage / "home").glob("*/agent/coder/session/*/terminal"):
            ctx_run("agent", "stop", "coder", "--session", entry.parent.name, env=env)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def queue(world: World, request: pytest.FixtureRequest) -> QueueCLI:
    """A queue of the test's own in the world's root."""
    project = "q-" + request.node.name.removeprefix("test_")[:30].rstrip("_-.[")
    made = world.ctx("queue", "init", "--project", project)
    assert made.rc == 0, made
    return QueueCLI(world.storage, project)


# ------------------------------------------------------------------ the queue (§2)


def test_request_and_result_fields_show_escaped_in_text_and_exact_in_json(
    world: World, queue: QueueCLI
) -> None:
    """§2.1, §2.4: a request whose input, and one of whose keys, hold every sequence, and a
    result holding them too: ``show`` (pipe and terminal) shows each escaped and on its own
    line, ``claim --json``, ``show --json`` and ``list --json`` give back exactly what was
    published and finished."""
    published = {"tool": "esc.tool", "input": {"note": HOSTILE}, "key\x1b[2J\u009b": LINE}
    job = queue.publish(published, name="hostile")
    claimed = queue.run("claim", "--json")
    assert claimed.rc == 0 and claimed.json()["name"] == job, claimed
    request = claimed.json()["request"]
    assert {k: v for k, v in request.items() if k not in ("from", "created")} == published
    output = {"said": HOSTILE, LINE: [LINE]}
    queue.finish(job, "--error", output)

    for args in (("show", job), ("status",), ("list",)):
        piped, tty = world.both("queue", *args, "--project", queue.project)
        assert piped.rc == 0, piped
        for shown in (piped.out + piped.err, tty):
            assert acted_on(shown) == [], (args, shown)
    piped, tty = world.both("queue", "show", job, "--project", queue.project)
    for shown in (piped.out, tty):
        assert shows_escaped(shown), shown
        assert len([ln for ln in shown.splitlines() if ln.startswith("request: ")]) == 1, shown

    shown = queue.run("show", job, "--json")
    assert shown.rc == 0 and shown.json()["request"] == request, shown
    assert shown.json()["result"]["output"] == output, shown
    listed = queue.run("list", "--json")
    assert listed.rc == 0 and job in json.dumps(listed.json()), listed


def test_ignored_names_of_a_queue_show_escaped_and_come_back_whole_from_json(
    world: World, queue: QueueCLI
) -> None:
    """Q-8: a group member may plant files whose names hold escape sequences, a C1 control,
    a bidirectional override and bytes that are not UTF-8; ``status`` and ``recover`` list
    them as ignored — escaped on a pipe and on a terminal — and ``status --json`` names each
    so that its bytes come back exactly (``os.fsencode``)."""
    planted = {
        b"pending/x\x1b]52;c;SGk=\x07\r\xc2\x9b\xe2\x80\xaey.req.json",
        b"pending/bad\xff\x1b[2J\x08.req.json",
        b"done/d\x1b[1A\x7f",
    }
    for name in planted:
        path = os.path.join(os.fsencode(queue.dir), name)
        if name.startswith(b"done/"):
            os.mkdir(path)
        else:
            Path(os.fsdecode(path)).write_bytes(b"{}")
    for args in (("status",), ("recover",)):
        piped, tty = world.both("queue", *args, "--project", queue.project)
        assert piped.rc == 0, piped
        for shown in (piped.out, tty):
            assert acted_on(shown) == [], (args, shown)
            assert shown.count("ignored") >= 3 and "\\x1b]52;c;SGk=\\x07" in shown, shown
            assert "\\udcff" in shown or "\\xff" in shown, shown
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    assert acted_on(status.out) == [], status.out
    named = {os.fsencode(entry["path"]) for entry in status.json()["ignored"]}
    assert named == planted, named


def test_a_lease_another_host_wrote_shows_escaped_in_show_and_recover(
    world: World, queue: QueueCLI
) -> None:
    """Q-3, Q-5, §2.4: the lease of a claimed job names its holder's worker and host, which a
    worker on another host wrote; ``show`` and ``recover`` quote them escaped (the holder is
    not provably gone, so nothing moves), ``show --json`` gives them back exactly."""
    job = queue.publish({"tool": "shell.exec", "input": {"cmd": "true"}}, name="leased")
    assert queue.claim("--pid", str(os.getpid())) == job
    lease = queue.lease(job)
    lease.update(worker="w\x1b]52;c;SGk=\x07\u009b2J", host="other\x1b[2J\u202eh")
    queue.write_lease(job, lease)
    for args in (("show", job), ("recover",)):
        piped, tty = world.both("queue", *args, "--project", queue.project)
        assert piped.rc == 0, piped
        for shown in (piped.out, tty):
            assert acted_on(shown) == [] and "other\\x1b[2J\\u202eh" in shown, shown
    assert queue.state(job) == "claimed"
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0 and shown.json()["lease"] == lease, shown


def test_a_workers_lines_quote_the_tools_stderr_escaped_on_a_pipe_and_a_terminal(
    world: World, queue: QueueCLI
) -> None:
    """W-1, §2.4: a job whose tool writes sequences on stdout and stderr and exits 4 fails;
    the worker's ``failed J: reason`` line (a pipe) quotes the stderr escaped, its live line
    on a terminal holds no control but its own redraw, ``--json`` events parse, and the
    result keeps the tool's output and stderr exactly."""
    request = {"tool": "esc.tool", "input": {}}
    first = queue.publish(request, name="esc-1")
    work = queue.run("work", "--agent", "coder", "--drain")
    assert work.rc == 0, work
    assert acted_on(work.out + work.err) == [], work
    [failed] = [line for line in work.out.splitlines() if line.startswith("failed")]
    assert failed.startswith(f"failed  {first}: esc.tool exited with status 4: "), failed
    assert shows_escaped(failed), failed
    state, result = queue.only_result(first)
    assert state == "failed" and result["output"] == HOSTILE, result
    assert result["stderr"] == LINE + "\n", result

    second = queue.publish(request, name="esc-2")
    rc, shown = on_tty(
        [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", "coder", "--drain"],
        world.env,
    ).finish()
    assert rc == 0, shown
    assert "\r\x1b[K" in shown and f"last: {second}" in shown, shown  # the live line
    assert acted_on(terminal_text(shown)) == [], shown
    assert queue.only_result(second)[0] == "failed"

    third = queue.publish(request, name="esc-3")
    work = queue.run("work", "--agent", "coder", "--drain", "--json")
    assert work.rc == 0 and acted_on(work.out) == [], work
    events = [json.loads(line) for line in work.out.splitlines()]
    finish = [e for e in events if e.get("event") == "finish" and e.get("job") == third]
    assert finish and finish[0]["state"] == "failed", events


# ------------------------------------------------------------------ ctx run, hooks (T-3, T-6)


def test_ctx_run_quotes_a_pre_hooks_name_and_message_escaped(world: World) -> None:
    """T-6 (docs/tools.md: a veto is ``EACCES`` naming the hook and quoting the last line of
    its stderr): the hook's file name and message hold sequences; ``ctx run``'s error line
    shows them escaped on a pipe and on a terminal; the native ``result`` frame is exact JSON
    whose message holds them as they were; the session's text view escapes them."""
    piped, tty = world.both("run", "--agent", "coder", "--session", "veto", "veto.tool")
    assert piped.rc != 0 and piped.out == "", piped
    for shown in (piped.err, tty):
        assert shown.startswith("ctx: EACCES: hooks/pre.d/10-veto"), shown
        assert acted_on(shown) == [] and shows_escaped(shown), shown

    native = world.ctx("run", "--agent", "coder", "--session", "veto", "--native", "veto.tool",
                       input="{}")  # fmt: skip
    assert native.rc == 1 and acted_on(native.out) == [], native
    result = json.loads(native.out.splitlines()[-1])
    message = result["error"]["message"]
    assert result["error"]["error"] == "EACCES" and result["error"]["stage"] == "hook", result
    assert f"hooks/pre.d/{HOOK_NAME}" in message and LINE in message, message

    piped, tty = world.both("session", "show", "coder", "veto")
    for shown in (piped.out, tty):
        assert acted_on(shown) == [] and "10-veto" in shown, shown


# ------------------------------------------------------------------ sessions (S-2, S-5)


def hostile_event(session: str) -> dict:
    return {
        "ts": "2026-06-22T12:00:00Z\x1b[2J",
        "type": "tool_call\u202e",
        "agent": "coder",
        "session": session,
        "object": "tool/x\x1b]52;c;SGk=\x07",
        "status": "ok\u009b1A\x7f",
        "note\x1b[31m": HOSTILE,
    }


def plant_event(world: World, session: str, event: dict) -> None:
    """One event line appended as a writer of the session may (one write, O_APPEND), its
    text as UTF-8 (C1, DEL and the override raw in the file, as JSON allows)."""
    path = world.session_dir(session) / "events.jsonl"
    line = json.dumps(event, ensure_ascii=False).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def test_session_show_and_tail_show_planted_event_fields_escaped_and_json_exact(
    world: World,
) -> None:
    """S-2, S-5 (docs/sessions.md; cortexfs/cli/session.py: whoever may write the file chose
    every character): an event appended to a session with sequences in every column and in a
    key of its own is shown on one line with none of them raw by ``session show`` and
    ``session tail`` (pipe and terminal), and ``--json`` gives back exactly the events the
    file holds, with no raw control either."""
    ran = world.ctx("run", "--agent", "coder", "--session", "planted", "esc.tool")
    assert ran.rc == 4, ran
    plant_event(world, "planted", hostile_event("planted"))
    lines = (world.session_dir("planted") / "events.jsonl").read_bytes().splitlines()
    stored = [json.loads(line) for line in lines]
    for command in ("show", "tail"):
        piped, tty = world.both("session", command, "coder", "planted")
        assert piped.rc == 0, piped
        for shown in (piped.out, tty):
            assert acted_on(shown) == [], (command, shown)
            assert len(shown.splitlines()) == len(stored), shown
            assert "tool/x\\x1b]52;c;SGk=\\x07" in shown and "\\u202e" in shown, shown
        as_json = world.ctx("session", command, "coder", "planted", "--json")
        assert as_json.rc == 0 and acted_on(as_json.out) == [], as_json
        assert [json.loads(line) for line in as_json.out.splitlines()] == stored


def test_session_tail_follow_on_a_terminal_shows_an_appended_event_escaped(world: World) -> None:
    """S-5, S-2: ``session tail --follow`` on a terminal prints an event appended while it
    follows on one line, escaped, and Ctrl-C ends it with status 0."""
    ran = world.ctx("run", "--agent", "coder", "--session", "followed", "esc.tool")
    assert ran.rc == 4, ran
    tty = on_tty([*CTX_ARGV, "session", "tail", "coder", "followed", "--follow"], world.env)
    try:
        assert tty.shows("tool_result"), tty.text()
        plant_event(world, "followed", hostile_event("followed"))
        assert tty.shows("\\x1b[2J"), tty.text()
        assert tty.shows("\n", 5)
    finally:
        tty.proc.send_signal(signal.SIGINT)
    rc, shown = tty.finish()
    assert rc == 0, shown
    assert acted_on(terminal_text(shown)) == [], shown


# ------------------------------------------------------------------ objects, policy (T-8, P-5)


def test_a_manifests_description_shows_escaped_in_object_list_and_exact_in_json(
    world: World,
) -> None:
    """T-8, T-8a: the description of an installed manifest holds sequences; ``object list``
    shows it escaped (pipe and terminal), ``object list --json`` gives it back exactly."""
    piped, tty = world.both("object", "list")
    assert piped.rc == 0, piped
    for shown in (piped.out, tty):
        [line] = [ln for ln in shown.splitlines() if ln.startswith("esc.tool ")]
        assert acted_on(shown) == [] and shows_escaped(line), line
    listed = world.ctx("object", "list", "--json")
    assert listed.rc == 0, listed
    [entry] = [e for e in listed.json() if e["name"] == "esc.tool"]
    assert entry["description"] == "Says " + LINE


def test_a_hand_edited_agent_label_is_quoted_escaped_by_explain_and_agent_views(
    world: World,
) -> None:
    """P-5 step 4, P-8: an agent whose label file was edited to hold sequences is denied at
    step 4; ``policy explain``, ``agent show``, ``agent list`` and ``ctx run`` quote the
    label escaped, on a pipe and on a terminal."""
    request = {"name": "labelled", "label": "labelled_t", "tools": ["esc.tool"]}
    made = world.ctx("agent", "create", "-", "--json", input=json.dumps(request))
    assert made.rc == 0, made
    (world.storage / "agent" / "labelled.d" / "label").write_text("la\x1b]0;T\x07\x1b[2Jb_t\n")
    for args in (
        ("policy", "explain", "labelled", "tool:esc.tool", "execute"),
        ("agent", "show", "labelled"),
        ("agent", "list"),
        ("run", "--agent", "labelled", "esc.tool"),
    ):
        piped, tty = world.both(*args)
        for shown in (piped.out + piped.err, tty):
            assert acted_on(shown) == [], (args, shown)
            assert "la\\x1b]0;T\\x07\\x1b[2Jb_t" in shown, (args, shown)


# ------------------------------------------------------------------ the root's own path


def test_a_storage_root_whose_path_holds_sequences_is_named_escaped_everywhere(
    world: World,
) -> None:
    """R-1, §2.4: a storage root below a directory named with an OSC 52 write, a clear-screen
    sequence, a C1 control and an override: every command that names the root shows the path
    escaped (pipe and terminal), and ``--json`` names it exactly."""
    odd = world.top / "root\x1b]52;c;SGk=\x07\x1b[2J\u009b\u202e"
    odd.mkdir(mode=0o755)
    storage = odd / "storage"
    boot = ctx_run("bootstrap", "--storage", storage)
    assert boot.rc == 0 and acted_on(boot.out + boot.err) == [], boot
    env = clean_env(CTX_STORAGE=str(storage))
    for args in (
        ("queue", "init", "--project", "p"),
        ("queue", "status", "--project", "p"),
        ("object", "which", "fs.read"),
        ("shared", "create", "sp"),
    ):
        piped = ctx_run(*args, env=env)
        rc, tty = on_tty([*CTX_ARGV, *args], env).finish()
        assert piped.rc == 0 and rc == 0, (piped, tty)
        for shown in (piped.out + piped.err, terminal_text(tty)):
            assert acted_on(shown) == [] and "root\\x1b]52;c;SGk=\\x07" in shown, (args, shown)
    status = ctx_run("queue", "status", "--project", "p", "--json", env=env)
    assert status.rc == 0 and acted_on(status.out) == [], status
    assert status.json()["queue"] == str(storage / "shared" / "p" / "queue"), status


# ------------------------------------------------------------------ ctxmcp (M-3)

OPEN = {"type": "object"}
MCP_SERVER = (
    WIRE
    + r"""
TOOLS = json.loads(sys.argv[1])
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "s", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_ctxmcp_list_shows_remote_names_and_descriptions_escaped_and_json_exact(
    world: World,
) -> None:
    """M-1, M-3: a server's tool whose description holds sequences, and one whose name does
    (not projectable): ``ctxmcp list`` shows both escaped on a pipe and a terminal;
    ``--json`` gives the remote names and descriptions back exactly."""
    mcp = world.top / "mcp"
    mcp.mkdir(mode=0o755, exist_ok=True)
    (mcp / "server.py").write_text(MCP_SERVER)
    bad = "bad\x1b]0;PWNED\x07n"
    tools = [
        {"name": "good", "description": "One " + LINE + "\nsecond", "inputSchema": OPEN},
        {"name": bad, "description": "Two " + LINE, "inputSchema": OPEN},
    ]
    config = mcp / "mcp.json"
    entry = {"command": str(PYTHON), "args": [str(mcp / "server.py"), json.dumps(tools)]}
    config.write_text(json.dumps({"mcpServers": {"m": entry}}))
    argv = [str(CTXMCP), "list", "--config", str(config), "--server", "m"]
    piped = subprocess.run(argv, capture_output=True, env=world.env, timeout=60)
    rc, tty = on_tty(argv, world.env).finish()
    assert piped.returncode == 0 and rc == 0, (piped, tty)
    for shown in (piped.stdout.decode() + piped.stderr.decode(), terminal_text(tty)):
        assert acted_on(shown) == [], shown
        assert "m.good\tOne osc52\\x1b]52;c;SGVsbG8=\\x07" in shown, shown
        assert "bad\\x1b]0;PWNED\\x07n" in shown, shown
    listed = subprocess.run([*argv, "--json"], capture_output=True, env=world.env, timeout=60)
    assert listed.returncode == 0 and acted_on(listed.stdout.decode()) == [], listed
    got = {t["tool"]: t for t in json.loads(listed.stdout)["tools"]}
    assert got["good"]["description"] == "One " + LINE + "\nsecond", got
    assert got[bad]["name"] is None and got[bad]["description"] == "Two " + LINE, got


# ------------------------------------------------------------------ tsh (H-1, H-2, T-6)


@contextlib.contextmanager
def terminal(world: World, session: str) -> Iterator[Raw]:
    """An agent terminal of coder (``ctx agent start``), joined by a client in attach mode;
    stopped at the end."""
    started = world.ctx("agent", "start", "coder", "--session", session, "--json", cwd=world.ws)
    assert started.rc == 0, started
    try:
        client = Raw(Path(started.json()["listening_at"]), b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            yield client
        finally:
            client.close()
    finally:
        world.ctx("agent", "stop", "coder", "--session", session)


def typed(client: Raw, line: str) -> str:
    """Type ``line`` at tsh's prompt: what the terminal showed up to the next prompt, the
    echo of the line included."""
    prompts = client.count(AGENT_PROMPT)
    client.type(line)
    assert client.shows(AGENT_PROMPT, prompts + 1), client.text()[-800:]
    return client.text().split(AGENT_PROMPT)[prompts]


def test_tsh_shows_a_typed_name_it_cannot_find_escaped(world: World) -> None:
    """H-1, H-2 (docs/tools.md: whatever tsh shows that others wrote — a name that was typed —
    is shown escaped, never raw to the terminal and those watching it): a name typed with an
    OSC 52 clipboard write in it that is no tool is echoed as ``^[`` and reported escaped."""
    name = "nosuch\x1b]52;c;SGk=\x07x"
    with terminal(world, "tsh-run") as client:
        shown = typed(client, name)
    assert acted_on(terminal_text(shown)) == [], shown
    assert "nosuch\\x1b]52;c;SGk=\\x07x: not a tool on CTX_PATH" in shown, shown


def test_tsh_builtins_show_a_typed_name_they_cannot_find_escaped(world: World) -> None:
    """H-1 (docs/tools.md, as above): ``which``, ``describe``, ``pin``, ``unpin`` and
    ``unload`` given a typed name holding an OSC 52 write say it is not on ``CTX_PATH``
    with the name escaped, as tsh's own not-a-tool message does."""
    name = "a\x1b]52;c;SGk=\x07b"
    with terminal(world, "tsh-builtins") as client:
        shown = {verb: typed(client, f"{verb} {name}") for verb in
                 ("which", "describe", "pin", "unpin", "unload")}  # fmt: skip
    for verb, text in shown.items():
        assert "a\\x1b]52;c;SGk=\\x07b" in text, (verb, text)
        assert acted_on(terminal_text(text)) == [], (verb, text)


def test_tsh_quotes_a_pre_hooks_veto_escaped_on_the_agent_terminal(world: World) -> None:
    """T-6, H-1, A-2 (docs/tools.md: whatever tsh shows that others wrote is shown escaped):
    ``veto.tool`` typed in the agent terminal is refused by its pre-hook (``EACCES``); the
    refusal on the terminal names the hook and quotes its message escaped, as ``ctx run``
    does, so that neither the OSC title in the hook's name nor the OSC 52 write in its message
    reaches the operator attached to the terminal."""
    with terminal(world, "tsh-veto") as client:
        shown = typed(client, "veto.tool")
    assert "EACCES" in shown and "vetoed" in shown, shown
    assert acted_on(terminal_text(shown)) == [], shown
    assert shows_escaped(shown), shown


def test_tsh_describe_shows_a_manifests_description_escaped(world: World) -> None:
    """T-8, H-1: ``describe esc.tool`` in the agent terminal shows the description from its
    manifest with every sequence escaped."""
    with terminal(world, "tsh-describe") as client:
        shown = typed(client, "describe esc.tool")
    assert acted_on(terminal_text(shown)) == [], shown
    assert shows_escaped(shown), shown
