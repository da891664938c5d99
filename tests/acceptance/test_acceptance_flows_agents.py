"""End-to-end flows of a user who brings an MCP server's tools to an agent and drives the
agent's terminal (SPEC §7, §8, §10, §12): ``ctxmcp list``/``project`` against the published
``mcp-server-time``, ``ctx object check``/``install``, the two policy layers, calls as the agent
in both modes, from a terminal it watches and joins, through ``ctx mount --as``; the host
tuning tsh with ``ctx tool``; an agent making a child with ``agent.create`` and rewriting its
own prompt with ``agent.update``; and the manual bundle as ``ctx man`` and an agent read it.

Each test chains several commands the way a user would; the single claims are checked one by
one in test_acceptance_mcp*.py, test_acceptance_terminal.py, test_acceptance_tsh.py,
test_acceptance_agents_edges.py, test_acceptance_spaces.py and
test_acceptance_surface_letter.py.  Black-box: the installed ``ctx`` and ``ctxmcp``, real
processes, sockets, PTYs and FUSE mounts; nothing of the product is imported."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    REPO,
    ROOT_ENTRIES,
    OnStorage,
    Run,
    clean_env,
    ctx_mount,
    read_jsonl,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
TIME_SERVER = Path(sys.executable).with_name("mcp-server-time")
NOW = "time.get_current_time"
CONVERT = "time.convert_time"
TIME_TOOLS = {NOW, CONVERT}
RUNTIME_CONFIG = "/mcp/mcp.json"  # where the agents see the host's configuration
SECRET = "tok-flows-9d2e-never-copied"
NOTE = "notes of the workspace\n"
H4_DEFAULTS = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}

# A raw client of a terminal socket, run as another uid: it sends the mode line (argv[2]),
# types argv[3] once the prompt shows, and prints all it was sent, up to the end or 2 s of
# quiet, as JSON.  A refused client is closed by the terminal: its send may then fail
# (EPIPE) and its read end in ECONNRESET after the refusal's line.
RAW_CLIENT = r"""
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
seen, typed = b"", len(sys.argv) < 4
try:
    sock.sendall(sys.argv[2].encode() + b"\n")
except OSError:
    pass
sock.settimeout(2)
try:
    while chunk := sock.recv(65536):
        seen += chunk
        if not typed and b"$ " in seen:
            sock.sendall(sys.argv[3].encode() + b"\r")
            typed = True
except OSError:
    pass
print(json.dumps(seen.decode("utf-8", "replace")))
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (nobody)")
needs_time_server = pytest.mark.skipif(
    not TIME_SERVER.exists() or not CTXMCP.exists(),
    reason="mcp-server-time or ctxmcp is not installed in the venv",
)
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)
needs_fuse = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
)
pytestmark = needs_root


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host(OnStorage):
    """A host administrator's machine: a directory every uid may search holding a
    bootstrapped storage root, a host-owned MCP configuration directory (``mcp/``, which
    agents mount read-only at ``/mcp``) and a workspace with one note in it."""

    top: Path
    storage: Path
    mcp: Path
    ws: Path


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = Path(tempfile.mkdtemp(prefix="ctx-flows-agents-", dir="/tmp"))
    top.chmod(0o755)
    try:
        storage = top / "storage"
        copy_of_root(_template, storage)
        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        entry = {
            "command": str(TIME_SERVER),
            "args": ["--local-timezone", "Etc/UTC"],
            "env": {"API_TOKEN": SECRET},
        }
        (mcp / "mcp.json").write_text(json.dumps({"mcpServers": {"time": entry}}))
        (mcp / "mcp.json").chmod(0o644)
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        (ws / "notes.txt").write_text(NOTE)
        (ws / "notes.txt").chmod(0o644)
        yield Host(top, storage, mcp, ws)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def ctxmcp(*args, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CTXMCP), *map(str, args)], capture_output=True, text=True, timeout=90, env=env
    )


def project_time(host: Host, out: Path) -> subprocess.CompletedProcess:
    """``ctxmcp project`` of the host's time server into ``out``, with ``$CTX_STORAGE`` set."""
    return ctxmcp(
        "project", "--config", host.mcp / "mcp.json", "--runtime-config", RUNTIME_CONFIG,
        "--server", "time", "--out", out, env=host.env,
    )  # fmt: skip


def install(host: Host, out: Path, *names: str) -> None:
    """``ctx object install OUT/NAME.manifest.json --tier system`` for each candidate."""
    for name in names:
        done = host.ctx("object", "install", out / f"{name}.manifest.json", "--tier", "system")
        assert done.rc == 0, done


def create_agent(host: Host, request: dict) -> int:
    """``ctx agent create`` as root (the agent runs as nobody); returns its uid."""
    made = host.ctx("agent", "create", "-", "--json", input=json.dumps(request))
    assert made.rc == 0, made
    return made.json()["identity"]["uid"]


def allow_tool(host: Host, label: str, tool: str) -> None:
    """The tool's half of P-6: ``allow LABEL tool:TOOL execute`` in ``tool/TOOL.d/policy``
    (the agent's half comes from the tools its request listed)."""
    with (host.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
        policy.write(f"allow {label} tool:{tool} execute\n")


def grant(host: Host, agent: str, rule: str) -> None:
    with (host.storage / "agent" / f"{agent}.d" / "policy").open("a") as policy:
        policy.write(f"allow {agent}_t {rule}\n")


def native(host: Host, agent: str, tool: str, payload, session: str = "default"):
    """``ctx run --native``; returns the run and its frames."""
    ran = host.ctx(
        "run", "--agent", agent, "--native", "--session", session, tool,
        input=json.dumps(payload),
    )  # fmt: skip
    frames = [json.loads(line) for line in ran.lines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", ran
    return ran, frames


def session_events(host: Host, uid: int, agent: str, session: str) -> list[dict]:
    home = host.storage / "home" / str(uid) / "agent" / agent
    return read_jsonl(home / "session" / session / "events.jsonl")


def calls_of(events: list[dict], tool: str) -> list[dict]:
    kinds = ("tool_call", "tool_result")
    return [e for e in events if e.get("object") == f"tool/{tool}" and e["type"] in kinds]


def socket_path(host: Host, uid: int, agent: str, session: str) -> Path:
    """A-2: the terminal socket's place in the storage root."""
    home = host.storage / "home" / str(uid) / "agent" / agent
    return home / "session" / session / "terminal" / "main.sock"


@contextlib.contextmanager
def terminal(host: Host, agent: str) -> Iterator[tuple[str, list[Run]]]:
    """``ctx agent start AGENT`` from the workspace (A-1), in a fresh session; stopped on the
    way out.  Yields the session and a list that holds the stop's run once it is done."""
    session = f"s{uuid.uuid4().hex[:10]}"
    where = [agent, "--session", session]
    started = host.ctx("agent", "start", *where, cwd=host.ws)
    assert started.rc == 0, started
    stops: list[Run] = []
    try:
        yield session, stops
    finally:
        if not stops or stops[0].rc != 0:
            host.ctx("agent", "stop", *where)


class Client:
    """A raw client of the terminal socket (A-2): one mode line, then PTY bytes."""

    def __init__(self, path: Path, mode: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.sock.sendall(mode)
        self.seen = b""
        self.closed = False

    def read_until(self, text: str, timeout: float = 30) -> str:
        """Everything read until ``text`` appeared since the previous call."""
        needle = text.encode()
        deadline = time.monotonic() + timeout
        while needle not in self.seen and not self.closed and time.monotonic() < deadline:
            self._recv(deadline)
        assert needle in self.seen, (text, self.seen.decode("utf-8", "replace")[-3000:])
        before, _, self.seen = self.seen.partition(needle)
        return before.decode("utf-8", "replace").replace("\r\n", "\n")

    def wait_closed(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self._recv(deadline)
        return self.closed

    def _recv(self, deadline: float) -> None:
        self.sock.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self.seen += chunk
        else:
            self.closed = True

    def type(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\r")

    def close(self) -> None:
        self.sock.close()


class Watcher:
    """``ctx agent watch`` running in the background, its output collected as it comes."""

    def __init__(self, host: Host, agent: str, session: str) -> None:
        argv = [*CTX_ARGV, "agent", "watch", agent, "--session", session]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=host.env,
        )  # fmt: skip
        self.out = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.out += chunk

    def shows(self, text: str, seconds: float = 30) -> bool:
        return wait_for(lambda: text.encode() in self.out, seconds)

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Its exit status and standard error once it has ended on its own."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)
        return self.proc.returncode, self.proc.stderr.read().decode()


def rules_of(policy: Path) -> list[str]:
    lines = policy.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def settings_of(config: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in rules_of(config))


# ------------------------------------------------------- §10: an MCP server's tool, end to end


@needs_time_server
def test_mcp_tool_projected_installed_granted_called_and_revoked(host: Host) -> None:
    """M-1 … M-4 with T-8, P-5, P-6, T-3, T-7, H-2: list and project the real time server
    (nothing written under the root, no ``mcp/``), check and install one candidate, see the
    call refused at step 6 until the tool's own policy names the label, then call it in
    terminal and native mode, each call in the session and the tool's log, while a human tsh
    describes it but cannot run it; refused at step 5 again once the agent's rule is taken
    back; the configuration's secret is copied nowhere."""
    storage = host.storage
    before = snapshot(storage)
    listed = ctxmcp("list", "--config", host.mcp / "mcp.json", "--server", "time", env=host.env)
    assert listed.returncode == 0, listed
    assert {line.split("\t")[0] for line in listed.stdout.splitlines()} == TIME_TOOLS, listed

    out = host.top / "candidates"
    projected = project_time(host, out)
    assert projected.returncode == 0, projected
    assert sorted(os.listdir(out)) == sorted(f"{name}.manifest.json" for name in TIME_TOOLS)
    assert snapshot(storage) == before, "ctxmcp wrote under the storage root (M-1)"
    assert set(os.listdir(storage)) == ROOT_ENTRIES  # no mcp/

    candidates = sorted(out.iterdir())
    checked = host.ctx("object", "check", *candidates)
    assert checked.rc == 0, checked
    assert sorted(checked.lines()) == sorted(
        f"{path}: valid ({path.name.removesuffix('.manifest.json')})" for path in candidates
    ), checked
    installed = host.ctx("object", "install", out / f"{NOW}.manifest.json", "--tier", "system")
    assert installed.rc == 0, installed
    assert installed.out == f"installed {NOW} in tier system: {storage / 'tool' / NOW}\n"
    objects = {o["name"]: o for o in host.ctx("object", "list", "--json").json()}
    assert objects[NOW]["status"] == "available" and objects[NOW]["tier"] == "system"
    assert CONVERT not in objects  # projected, never installed

    uid = create_agent(
        host,
        {
            "name": "coder",
            "label": "coder_t",
            "tools": [NOW],
            "mount": [[str(host.mcp), "/mcp", "ro"]],
        },
    )
    explain = ["policy", "explain", "coder", f"tool:{NOW}", "execute"]
    said = host.ctx(*explain)
    assert said.rc == 1 and said.lines()[-1].startswith("deny: EACCES: step 6"), said
    refused = host.ctx("run", "--agent", "coder", NOW, '{"timezone": "Etc/UTC"}')
    assert refused.rc == 126 and "step 6 (tool/model policy)" in refused.err, refused

    allow_tool(host, "coder_t", NOW)  # M-4: the ordinary class, tool:<s.t>
    said = host.ctx(*explain)
    assert said.rc == 0 and said.lines()[-1] == "allow", said
    ran = host.ctx("run", "--agent", "coder", NOW, '{"timezone": "Etc/UTC"}')
    assert ran.rc == 0, ran
    assert json.loads(ran.out)["timezone"] == "Etc/UTC", ran  # terminal mode: the text
    ran, frames = native(host, "coder", NOW, {"timezone": "Asia/Tokyo"})
    assert ran.rc == 0 and [f["type"] for f in frames] == ["call", "result"], ran
    result = frames[-1]
    assert result["status"] == "ok" and result["output"]["isError"] is False, result
    assert result["output"]["structuredContent"]["timezone"] == "Asia/Tokyo", result
    human = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"))
    tsh = [str(storage / "bin" / "tsh")]
    described = subprocess.run([*tsh, "describe", NOW], capture_output=True, text=True,
                               env=human, timeout=60)  # fmt: skip
    assert described.returncode == 0, described
    assert json.loads(described.stdout)["schema"]["required"] == ["timezone"], described
    logged = len(read_jsonl(storage / "tool" / f"{NOW}.d" / "log"))
    forged = subprocess.run([*tsh, NOW, '{"timezone": "Etc/UTC"}'], capture_output=True,
                            text=True, env=human, timeout=60)  # fmt: skip
    assert forged.returncode == 126 and "EACCES" in forged.stderr, forged  # H-2
    assert forged.stdout == "" and len(read_jsonl(storage / "tool" / f"{NOW}.d" / "log")) == logged
    missing = host.ctx("run", "--agent", "coder", CONVERT, "{}")
    assert missing.rc == 127 and "ENOENT" in missing.err, missing

    calls = calls_of(session_events(host, uid, "coder", "default"), NOW)
    assert [e["type"] for e in calls] == ["tool_call", "tool_result"] * 3, calls
    results = [e for e in calls if e["type"] == "tool_result"]
    assert (results[0]["status"], results[0]["stage"], results[0]["step"]) == (
        "error",
        "authorize",
        6,
    )
    assert [(e["status"], e.get("exit_status")) for e in results[1:]] == [("ok", 0), ("ok", 0)]
    assert [e["mode"] for e in calls if e["type"] == "tool_call"] == [
        "terminal",
        "terminal",
        "native",
    ]
    logged = read_jsonl(storage / "tool" / f"{NOW}.d" / "log")
    assert [e["call"] for e in logged] == [e["call"] for e in results], logged

    policy = storage / "agent" / "coder.d" / "policy"
    policy.write_text("".join(f"{line}\n" for line in rules_of(policy) if NOW not in line))
    said = host.ctx(*explain)
    assert said.rc == 1 and said.lines()[-1].startswith("deny: EACCES: step 5"), said
    revoked = host.ctx("run", "--agent", "coder", NOW, '{"timezone": "Etc/UTC"}')
    assert revoked.rc == 126 and "step 5 (object policy)" in revoked.err, revoked

    assert set(os.listdir(storage)) == ROOT_ENTRIES
    for path in storage.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), path


@needs_time_server
@needs_fuse
def test_an_agents_mount_shows_the_projected_tool_it_may_run_and_hides_it_once_revoked(
    host: Host,
) -> None:
    """M-4, T-5, F-1, R-2: through ``ctx mount --as coder`` the installed projection is an
    ordinary tool with its ``mcp`` locator, the candidate coder may not run is not there, the
    root keeps its six entries (no ``mcp``), and taking the tool's rule back hides it."""
    out = host.top / "candidates"
    assert project_time(host, out).returncode == 0
    install(host, out, *TIME_TOOLS)
    create_agent(
        host,
        {
            "name": "coder",
            "label": "coder_t",
            "tools": sorted(TIME_TOOLS),
            "mount": [[str(host.mcp), "/mcp", "ro"]],
        },
    )
    allow_tool(host, "coder_t", NOW)  # convert_time: the agent's layer only
    view = host.top / "view"
    with ctx_mount(host.storage, view, "--as", "coder"):
        assert set(os.listdir(view)) == ROOT_ENTRIES
        tools = set(os.listdir(view / "tool"))
        assert {NOW, f"{NOW}.d"} <= tools and CONVERT not in tools, tools
        assert os.access(view / "tool" / NOW, os.X_OK)
        assert json.loads((view / "tool" / f"{NOW}.d" / "mcp").read_text()) == {
            "transport": "stdio",
            "config": RUNTIME_CONFIG,
            "server": "time",
            "tool": "get_current_time",
        }
        policy = host.storage / "tool" / f"{NOW}.d" / "policy"
        policy.write_text(
            "".join(f"{line}\n" for line in rules_of(policy) if "coder_t" not in line)
        )
        assert wait_for(lambda: NOW not in os.listdir(view / "tool"), 10), "still shown"
    assert set(os.listdir(host.storage)) == ROOT_ENTRIES


# ------------------------------------------------------------- §8: the agent's own terminal


@needs_time_server
@needs_terminal
def test_mcp_tool_typed_in_the_agents_terminal_while_watched_then_stopped(host: Host) -> None:
    """A-1, A-2, H-1, T-5, M-4: in coder's terminal (joined through the socket in its session
    directory) ``tools`` lists what coder may run, the projected tool answers, a candidate
    its tool policy does not grant and a host command are not tools; a watcher sees it all
    and is let go when ``ctx agent stop`` ends the terminal, whose start and stop are facts
    in the agent's log and whose call is in the session."""
    out = host.top / "candidates"
    assert project_time(host, out).returncode == 0
    install(host, out, *TIME_TOOLS)
    uid = create_agent(
        host,
        {
            "name": "coder",
            "label": "coder_t",
            "tools": [*sorted(TIME_TOOLS), "fs.read"],
            "mount": [[str(host.mcp), "/mcp", "ro"]],
        },
    )
    allow_tool(host, "coder_t", NOW)
    allow_tool(host, "coder_t", "fs.read")
    marker = host.top / "host-command-ran"

    with terminal(host, "coder") as (session, stops):
        path = socket_path(host, uid, "coder", session)
        assert stat.S_ISSOCK(os.stat(path).st_mode), path
        watcher, typist = Client(path, b"watch\n"), Client(path, b"attach\n")
        try:
            typist.read_until("coder$ ")
            typist.type("tools")
            listed = typist.read_until("coder$ ").splitlines()
            assert NOW in listed and "fs.read" in listed and CONVERT not in listed, listed
            typist.type(f'{NOW} \'{{"timezone": "Etc/UTC"}}\'')
            answer = typist.read_until("coder$ ")  # the server's answer, not the echo
            assert '"datetime": "' in answer and '+00:00",' in answer, answer
            typist.type(f"{CONVERT} '{{}}'")
            assert "not a tool on CTX_PATH" in typist.read_until("coder$ ")
            typist.type(f"touch {marker}")
            assert "touch: not a tool on CTX_PATH" in typist.read_until("coder$ ")
            typist.type("fs.read notes.txt")
            assert NOTE.strip() in typist.read_until("coder$ ")
            shown = watcher.read_until(NOTE.strip())
            assert '"day_of_week": "' in shown and "touch: not a tool" in shown, shown

            stopped = host.ctx("agent", "stop", "coder", "--session", session)
            stops.append(stopped)
            assert stopped.rc == 0 and stopped.out.startswith(
                f"stopped coder, session {session} (pid "
            ), stopped
            assert watcher.wait_closed() and typist.wait_closed()
        finally:
            watcher.close()
            typist.close()
    assert not marker.exists()
    assert not os.path.lexists(path)

    calls = calls_of(session_events(host, uid, "coder", session), NOW)
    assert [(e["type"], e["status"]) for e in calls] == [("tool_call", "ok"), ("tool_result", "ok")]
    assert calls[0]["mode"] == "terminal", calls
    assert not [
        e
        for e in calls_of(session_events(host, uid, "coder", session), CONVERT)
        if e["status"] == "ok"
    ]
    lifecycle = [
        e
        for e in read_jsonl(host.storage / "agent" / "coder.d" / "log")
        if e.get("session") == session
    ]
    assert [e["type"] for e in lifecycle] == ["terminal.started", "terminal.stopped"], lifecycle
    assert lifecycle[0]["workspace"] == str(host.ws)


@needs_terminal
def test_host_tunes_tsh_with_ctx_tool_and_the_joined_terminal_obeys(host: Host) -> None:
    """H-3, H-4, A-2, H-1: bootstrap's ``tool/tsh.d/config`` holds the defaults; the host
    changes them with ``ctx tool tsh.config`` (comment kept, a host record in the tool's log)
    while ``ctx tool`` refuses fs.write and shell.exec; in coder's terminal, joined with
    ``ctx agent attach`` and watched with ``ctx agent watch``, tsh.config reads the new
    settings, tsh's context keeps ``max_loaded_tools`` tools, coder's own update is refused
    and a host command never runs."""
    config = host.storage / "tool" / "tsh.d" / "config"
    comments = [line for line in config.read_text().splitlines() if line.startswith("#")]
    assert settings_of(config) == H4_DEFAULTS
    tool_env = clean_env(CTX_STORAGE=str(host.storage), CTX_PATH=str(host.storage / "tool"))
    tuned = host.ctx("tool", "tsh.config", "max_loaded_tools=2", "cache_capacity=48", env=tool_env)
    assert tuned.rc == 0, tuned
    wanted = {"max_loaded_tools": "2", "cache_capacity": "48", "window_percent": "1"}
    assert settings_of(config) == wanted
    assert [line for line in config.read_text().splitlines() if line.startswith("#")] == comments
    record = read_jsonl(host.storage / "tool" / "tsh.config.d" / "log")[-1]
    assert (record["mode"], record["uid"], record["agent"]) == ("host", 0, ""), record
    assert record["argv"] == ["max_loaded_tools=2", "cache_capacity=48"], record
    written = host.ws / "written"
    for name, arg in (
        ("fs.write", json.dumps({"path": str(written), "content": "x"})),
        ("shell.exec", f"touch {written}"),
    ):
        refused = host.ctx("tool", name, arg, env=tool_env)
        assert refused.rc == 1 and "EACCES" in refused.err, refused
    assert not written.exists()

    uid = create_agent(
        host, {"name": "coder", "label": "coder_t", "tools": ["fs.read", "fs.list", "tsh.config"]}
    )
    for tool in ("fs.read", "fs.list", "tsh.config"):
        allow_tool(host, "coder_t", tool)
    marker = host.top / "host-command-ran"
    with terminal(host, "coder") as (session, stops):
        watcher = Watcher(host, "coder", session)
        try:
            script = (
                "tsh.config\n"
                "load fs.read fs.list tsh.config\n"
                "tsh.config cache_capacity=99\n"
                f"touch {marker}\n"
                "fs.read notes.txt\n"
            )
            joined = host.ctx("agent", "attach", "coder", "--session", session, input=script)
            assert joined.rc == 0, joined
            assert watcher.shows(NOTE.strip()), watcher.out
            shown = watcher.out.decode("utf-8", "replace")
            assert "max_loaded_tools=2" in shown and "cache_capacity=48" in shown, shown
            assert "(max_loaded_tools reached)" in shown, shown
            assert "tsh.config: EACCES" in shown, shown
            assert "touch: not a tool on CTX_PATH" in shown, shown
            stopped = host.ctx("agent", "stop", "coder", "--session", session)
            stops.append(stopped)
            assert stopped.rc == 0, stopped
            status, err = watcher.finish()
        finally:
            if watcher.proc.poll() is None:
                watcher.proc.kill()
                watcher.proc.wait()
    assert status == 0 and "closed the connection" in err, err
    assert not marker.exists()
    assert settings_of(config) == wanted  # the agent's update changed nothing
    events = session_events(host, uid, "coder", session)
    assert [e["status"] for e in calls_of(events, "fs.read")] == ["ok", "ok"], events
    results = [e for e in calls_of(events, "tsh.config") if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["ok", "error"], results


@needs_terminal
def test_who_may_watch_and_join_an_agents_terminal(
    host: Host, unprivileged_user: UnprivilegedUser
) -> None:
    """A-2: root may watch and attach; the agent's own uid may watch (what it sends is never
    typed) but not attach; any other uid is refused both by ``ctx agent watch`` before it
    connects and by the terminal itself (``ctxterm: EACCES``) when it speaks the protocol
    directly.  Only what root typed ran in the session."""
    python = Path("/usr/bin/python3")
    if not python.exists():
        pytest.skip("no /usr/bin/python3 for a client running as another uid")
    uid = create_agent(host, {"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    allow_tool(host, "coder_t", "fs.read")
    nobody = UnprivilegedUser("nobody", uid, pwd.getpwuid(uid).pw_gid)
    stranger = unprivileged_user

    def client(user: UnprivilegedUser, path: Path, mode: str, *line: str) -> str:
        done = run_as(user, [str(python), "-c", RAW_CLIENT, str(path), mode, *line])
        assert done.returncode == 0, done
        return json.loads(done.stdout)

    with terminal(host, "coder") as (session, _):
        path = socket_path(host, uid, "coder", session)
        place = Path(os.readlink(path))  # A-2's /run/.../<uid>/<agent>/<session>/main.sock
        assert place.name == "main.sock" and place.parent.name == session, place

        watched = client(nobody, path, "watch", "fs.read notes.txt")
        assert "coder$ " in watched and "ctxterm" not in watched, watched
        refused = client(nobody, path, "attach")
        assert refused.startswith("ctxterm: EACCES: uid") and "watch it instead" in refused
        for mode in ("watch", "attach"):
            refused = client(stranger, place, mode)
            assert refused.startswith(f"ctxterm: EACCES: uid {stranger.uid} may not"), refused
        env = clean_env(CTX_STORAGE=str(host.storage))
        argv = [*CTX_ARGV, "agent", "watch", "coder", "--session", session]
        told = run_as(stranger, argv, env=env, stdin="")
        assert told.returncode == 1 and "EACCES" in told.stderr, told
        assert told.stdout == "", told

        with contextlib.closing(Client(path, b"attach\n")) as root_client:
            root_client.read_until("coder$ ")
            root_client.type("fs.read notes.txt")
            assert NOTE.strip() in root_client.read_until("coder$ ")
    calls = calls_of(session_events(host, uid, "coder", session), "fs.read")
    assert [e["type"] for e in calls] == ["tool_call", "tool_result"], calls


# ----------------------------------------------------------- what an agent may do


@pytest.mark.parametrize("via", ["terminal", "native"])
def test_parent_makes_a_helper_that_works_within_what_it_was_given(host: Host, via: str) -> None:
    """A-4, P-6, P-7, S-3: an agent holding ``agent:helper create`` makes ``helper`` with part
    of its own grants and a mount seen at its own ``/workspace``; the child runs as the parent,
    holds exactly what was asked, needs the tool layer like any agent, cannot create in turn,
    and both logs record the creation; a second helper, another agent's label or a tool the
    parent lacks is refused and nothing else appears."""
    parent_uid = create_agent(
        host,
        {
            "name": "parent",
            "label": "parent_t",
            "tools": ["fs.read", "fs.list", "agent.create"],
            "mount": [[str(host.ws), "/workspace", "ro"]],
        },
    )
    create_agent(host, {"name": "other", "label": "other_t"})
    for tool in ("fs.read", "fs.list", "agent.create"):
        allow_tool(host, "parent_t", tool)
    grant(host, "parent", "agent:helper create")
    request = {
        "name": "helper",
        "label": "helper_t",
        "tools": ["fs.read"],
        "mount": [["/workspace", "/data", "ro"]],
    }
    if via == "terminal":
        made = host.ctx("run", "--agent", "parent", "agent.create", json.dumps(request))
        assert made.rc == 0 and made.out == "created agent helper\n", made
    else:
        made, frames = native(host, "parent", "agent.create", request)
        assert made.rc == 0, made
        output = frames[-1]["output"]
        assert (output["agent"], output["label"], output["uid"]) == (
            "helper",
            "helper_t",
            parent_uid,
        )

    agents = {a["name"]: a for a in host.ctx("agent", "list", "--json").json()}
    assert agents["helper"]["label"] == "helper_t" and agents["helper"]["problems"] == []
    assert agents["helper"]["identity"] == agents["parent"]["identity"]
    controls = host.storage / "agent" / "helper.d"
    assert json.loads((controls / "mount").read_text()) == [
        [str(host.ws), "/data", "ro"],
        [str(host.storage), "/ctx", "ro"],
    ]
    assert sorted(rules_of(controls / "policy")) == sorted(
        [
            "allow helper_t tool:fs.read execute",
            "allow helper_t mount:data read",
            "allow helper_t mount:ctx read",
        ]
    )
    created = read_jsonl(controls / "log")[0]
    assert (created["type"], created["by"], created["parent"]) == (
        "agent.created",
        "agent.create",
        "parent",
    )
    told = [e for e in read_jsonl(host.storage / "agent" / "parent.d" / "log") if e.get("child")]
    assert [(e["type"], e["child"]) for e in told] == [("agent.created", "helper")], told

    first = host.ctx("run", "--agent", "helper", "fs.read", "/data/notes.txt")
    assert first.rc == 126 and "step 6" in first.err, first  # the tool layer is the host's
    allow_tool(host, "helper_t", "fs.read")
    read = host.ctx("run", "--agent", "helper", "fs.read", "/data/notes.txt")
    assert (read.rc, read.out) == (0, NOTE), read
    for tool, arg in (("fs.list", "/data"), ("agent.create", '{"name": "g", "label": "g_t"}')):
        refused = host.ctx("run", "--agent", "helper", tool, arg)
        assert refused.rc == 126 and "step 5 (object policy)" in refused.err, refused

    kept = snapshot(controls)
    grant(host, "parent", "agent:h3 create")
    for child, word in (
        ({"name": "helper", "label": "helper_t"}, "EEXIST"),
        ({"name": "helper2", "label": "helper2_t"}, "EACCES"),
        ({"name": "h3", "label": "other_t"}, "EACCES"),
        ({"name": "h3", "label": "h3_t", "tools": ["shell.exec"]}, "EACCES"),
    ):
        refused = host.ctx("run", "--agent", "parent", "agent.create", json.dumps(child))
        assert refused.rc == 1 and f"agent.create: {word}" in refused.err, (child, refused)
    assert snapshot(controls) == kept
    assert sorted(n for n in os.listdir(host.storage / "agent") if not n.startswith(".")) == sorted(
        f"{name}{suffix}" for name in ("parent", "other", "helper") for suffix in ("", ".d")
    )
    assert set(os.listdir(host.storage)) == ROOT_ENTRIES


def test_agent_update_rewrites_its_own_prompt_and_nothing_else_it_can_reach(host: Host) -> None:
    """A-5, S-3, S-4, T-5: coder replaces its system.md and prompt.template.md in both modes,
    reads the new text back through its view of ``/ctx``, and its log records the updates as
    facts without the text; its policy stays out of reach of agent.update (EINVAL) and of
    fs.write (read-only view), and another agent's controls are not in its view at all."""
    uid = create_agent(
        host,
        {"name": "coder", "label": "coder_t", "tools": ["agent.update", "fs.read", "fs.write"]},
    )
    create_agent(host, {"name": "other", "label": "other_t"})
    for tool in ("agent.update", "fs.read", "fs.write"):
        allow_tool(host, "coder_t", tool)
    coder = host.storage / "agent" / "coder.d"
    others = {p.name: p.read_bytes() for p in (host.storage / "agent" / "other.d").iterdir()}
    fixed = {name: (coder / name).read_bytes() for name in ("policy", "identity", "mount", "label")}

    system = "Review diffs only; cite the line.\n"
    run = host.ctx(
        "run",
        "--agent",
        "coder",
        "--session",
        "tune",
        "agent.update",
        json.dumps({"control": "system.md", "content": system}),
    )
    assert run.rc == 0 and run.out == "system.md of agent coder updated\n", run
    template = "Task: {{input}}\n"
    run, frames = native(
        host,
        "coder",
        "agent.update",
        {"control": "prompt.template.md", "content": template},
        session="tune",
    )
    assert run.rc == 0, run
    assert frames[-1]["output"] == {
        "agent": "coder",
        "control": "prompt.template.md",
        "bytes": len(template.encode()),
    }
    assert (coder / "system.md").read_text() == system
    assert (coder / "prompt.template.md").read_text() == template

    seen = host.ctx("run", "--agent", "coder", "fs.read", "/ctx/agent/coder.d/system.md")
    assert (seen.rc, seen.out) == (0, system), seen
    hidden = host.ctx("run", "--agent", "coder", "fs.read", "/ctx/agent/other.d/system.md")
    assert hidden.rc != 0 and "EACCES" in hidden.err, hidden
    grab = json.dumps({"control": "policy", "content": "allow coder_t tool:shell.exec execute\n"})
    refused = host.ctx("run", "--agent", "coder", "--session", "tune", "agent.update", grab)
    assert refused.rc != 0 and "EINVAL" in refused.err, refused
    write = json.dumps({"path": "/ctx/agent/coder.d/policy", "content": "allow coder_t x:y z\n"})
    refused = host.ctx("run", "--agent", "coder", "fs.write", write)
    assert refused.rc != 0 and "EROFS" in refused.err, refused

    assert {name: (coder / name).read_bytes() for name in fixed} == fixed
    assert {p.name: p.read_bytes() for p in (host.storage / "agent" / "other.d").iterdir()} == (
        others
    )
    updates = [e for e in read_jsonl(coder / "log") if e["type"] == "agent.updated"]
    assert [(e["control"], e["session"], e["status"]) for e in updates] == [
        ("system.md", "tune", "ok"),
        ("prompt.template.md", "tune", "ok"),
    ], updates
    assert "Review diffs" not in (coder / "log").read_text()  # S-4: facts, not the prompt
    results = [
        e
        for e in calls_of(session_events(host, uid, "coder", "tune"), "agent.update")
        if e["type"] == "tool_result"
    ]
    assert [e["status"] for e in results] == ["ok", "ok", "error"], results


# --------------------------------------------------------------------------- §12: the manual


def test_manual_reads_alike_in_ctx_man_and_in_an_agents_view_and_bootstrap_renews_it(
    host: Host,
) -> None:
    """D-1, X-2, R-5, T-5: after bootstrap each ``ctx man TOPIC`` alias prints the installed
    page, which an agent with no grant on the bundle reads identically through ``fs.read``
    under ``/ctx/shared/cortexfs-docs`` and cannot write; a page gone stale is what both
    read until ``ctx bootstrap`` puts this version's page back, read-only again."""
    create_agent(host, {"name": "reader", "label": "reader_t", "tools": ["fs.read", "fs.write"]})
    for tool in ("fs.read", "fs.write"):
        allow_tool(host, "reader_t", tool)
    bundle = host.storage / "shared" / "cortexfs-docs"
    pages = {"README": "README.md", **{t: f"man/{p}" for t, p in MAN_PAGES.items()}}

    def agent_reads(page: str) -> str:
        ran, frames = native(
            host, "reader", "fs.read", {"path": f"/ctx/shared/cortexfs-docs/{page}"}
        )
        assert ran.rc == 0, ran
        return frames[-1]["output"]["content"]

    for topic, page in pages.items():
        shown = host.ctx("man", topic)
        assert shown.rc == 0, shown
        installed = (bundle / page).read_text()
        assert shown.out == installed, topic
        assert agent_reads(page) == installed, topic

    target = bundle / "man" / MAN_PAGES["tool"]
    fresh = target.read_bytes()
    write = json.dumps({"path": f"/ctx/shared/cortexfs-docs/man/{target.name}", "content": "x"})
    refused = host.ctx("run", "--agent", "reader", "fs.write", write)
    assert refused.rc != 0 and "EROFS" in refused.err, refused
    assert target.read_bytes() == fresh

    target.chmod(0o644)  # an older install's page, or an edit
    target.write_text("# stale tool page\n")
    assert host.ctx("man", "tool").out == "# stale tool page\n"
    assert agent_reads(f"man/{target.name}") == "# stale tool page\n"
    renewed = host.ctx("bootstrap")
    assert renewed.rc == 0, renewed
    assert target.read_bytes() == fresh
    assert stat.S_IMODE(target.stat().st_mode) == 0o444
    assert host.ctx("man", "tool").out == fresh.decode()
    assert agent_reads(f"man/{target.name}") == fresh.decode()
