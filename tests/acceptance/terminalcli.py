"""Hand-written clients of an agent terminal's socket (SPEC A-2), for the end-to-end files:
what a third-party client does, byte for byte, beside ``ctx agent watch`` and ``attach``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.acceptance.ctxcli import (
    OnStorage,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root

AGENT_PROMPT = "coder$ "  # tsh's prompt in the terminal of agent coder


@dataclass
class Term:
    """A terminal ``ctx agent start`` started."""

    session: str
    link: Path  # A-2's place in the storage root
    listening_at: Path  # where the terminal listens

    @property
    def rundir(self) -> Path:
        return self.listening_at.parent


@dataclass
class CoderHost(OnStorage):
    """A storage root every uid may search (a copy of the bootstrapped template), agent
    ``coder`` (label ``coder_t``, uid ``nobody``) and its workspace ``ws``, which the agent
    owns; see :func:`coder_host`."""

    top: Path
    storage: Path
    ws: Path
    uid: int
    gid: int
    started: list[str] = field(default_factory=list)  # sessions to stop at the end

    def install(
        self, name: str, program: str, description: str | None = None, **manifest_options
    ) -> None:
        """Tool ``name`` running the shell text ``program``, installed in the system tier."""
        manifest = tool_manifest(
            self.top / "manifests", name, program, description=description, **manifest_options
        )
        installed = self.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed

    def grant_in_tool(self, tool: str, directory: Path | None = None) -> None:
        """The tool-side half of P-6: ``coder_t`` may execute ``tool``."""
        policy = (directory or self.storage / "tool") / f"{tool}.d" / "policy"
        with policy.open("a") as rules:
            rules.write(f"allow coder_t tool:{tool} execute\n")

    def session_dir(self, session: str) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" / session

    def events(self, session: str) -> list[dict]:
        return read_jsonl(self.session_dir(session) / "events.jsonl")

    def calls(self, session: str, tool: str, *kinds: str) -> list[dict]:
        """The events of ``session`` about ``tool`` (a system-tier name, or an object path), of
        the given ``kinds``: ``tool_call`` and ``tool_result`` when none is given."""
        obj = tool if "/" in tool else f"tool/{tool}"
        kinds = kinds or ("tool_call", "tool_result")
        return [e for e in self.events(session) if e.get("object") == obj and e["type"] in kinds]

    def lifecycle(self, session: str) -> list[dict]:
        """The terminal events of ``session`` in the agent's log."""
        log = read_jsonl(self.storage / "agent" / "coder.d" / "log")
        return [e for e in log if e.get("session") == session]

    def start(self, session: str | None = None) -> Term:
        """``ctx agent start coder`` run in the workspace (A-1), checked against what A-2
        promises of its socket; stopped when the host is taken down."""
        session = session or f"s{uuid.uuid4().hex[:10]}"
        started = self.ctx("agent", "start", "coder", "--session", session, "--json", cwd=self.ws)
        assert started.rc == 0, started
        self.started.append(session)
        facts = started.json()
        link = self.session_dir(session) / "terminal" / "main.sock"
        listening_at = Path(facts["listening_at"])
        assert facts["workspace"] == str(self.ws) and facts["socket"] == str(link), facts
        assert os.path.samefile(link, listening_at), (link, listening_at)  # the link leads there
        return Term(session, link, listening_at)

    def stop(self, session: str) -> None:
        """``ctx agent stop coder --session SESSION``, which must say it stopped the terminal;
        no longer stopped when the host is taken down."""
        stopped = self.ctx("agent", "stop", "coder", "--session", session)
        self.started.remove(session)
        assert stopped.rc == 0 and "stopped coder" in stopped.out, stopped


@contextlib.contextmanager
def coder_host(
    template: Path, scratch: Path, tools: list[str], files: dict[str, str]
) -> Iterator[CoderHost]:
    """A :class:`CoderHost` in a new directory below ``scratch``: agent ``coder`` made with
    ``tools`` in its request (nothing granted on the tools' side yet) and a workspace holding
    ``files`` (name to text, each readable by all).  Its terminals are stopped and its
    directory removed at the end."""
    top = new_scratch_dir(scratch)
    storage = copy_of_root(template, top / "storage")
    request = {"name": "coder", "label": "coder_t", "tools": tools}
    env = clean_env(CTX_STORAGE=str(storage))
    made = ctx_run("agent", "create", "-", "--json", input=json.dumps(request), env=env)
    assert made.rc == 0, made
    identity = made.json()["identity"]
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    for name, text in files.items():
        (ws / name).write_text(text)
        (ws / name).chmod(0o644)
    os.chown(ws, identity["uid"], identity["gid"])
    host = CoderHost(top, storage, ws, identity["uid"], identity["gid"])
    try:
        yield host
    finally:
        for session in host.started:
            stopped = ctx_run("agent", "stop", "coder", "--session", session, env=env)
            if stopped.rc != 0:  # a test took away what stop finds it by (the agent itself)
                _end_terminal_of(storage, session)
        shutil.rmtree(top, ignore_errors=True)


def _end_terminal_of(storage: Path, session: str) -> None:
    """SIGTERM to the terminal of ``session`` on ``storage`` that ``ctx agent stop`` could not
    end (it then unmounts its view and removes its runtime directory), SIGKILL after 15 s: no
    terminal of a test outlives it."""
    wanted = f"CTX_STORAGE={storage}".encode()
    ends: list[int] = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environment = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            if b"start" in command and session.encode() in command and wanted in environment:
                os.kill(int(entry), signal.SIGTERM)
                ends.append(int(entry))
    for pid in ends:
        if not wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}/cmdline"), 15):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def tsh_of(session: str) -> int:
    """The tsh serving ``session``, found by the environment ctxterm gave it."""
    marker = f"CTX_SESSION={session}".encode()
    found: list[int] = []

    def look() -> bool:
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                environment = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if marker in environment and b"/ctx/bin/tsh" in command[1:3]:
                    found.append(int(entry))
                    return True
        return False

    assert wait_for(look, 10), f"no tsh for session {session}"
    return found[0]


def connect(sock: socket.socket, path: Path) -> None:
    """Connect ``sock`` to ``path``, through its open directory when the path is longer than
    a UNIX socket address holds (as the docs tell a client of its own to do)."""
    if len(os.fsencode(path)) <= 107:
        sock.connect(str(path))
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{directory}/{path.name}")
    finally:
        os.close(directory)


class Raw:
    """A raw client of the terminal socket: it connects, sends ``first`` (its mode line,
    possibly more, possibly nothing), then collects what the terminal relays in a thread of
    its own, unless ``read`` is false (a client that never reads); it types lines ending in a
    carriage return, as a terminal does."""

    def __init__(
        self, path: Path, first: bytes = b"", *, read: bool = True, rcvbuf: int = 0
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        connect(self.sock, path)
        self.connected = time.monotonic()
        if first:
            self.sock.sendall(first)
        self.data = b""
        self.eof = threading.Event()
        self.ended_at: float | None = None
        self.reader = threading.Thread(target=self._pump, daemon=True) if read else None
        if self.reader:
            self.reader.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.ended_at = time.monotonic()
                self.eof.set()
                return
            self.data += chunk

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(data)

    def type(self, line: str | bytes) -> None:
        self.send((line.encode() if isinstance(line, str) else line) + b"\r")

    def count(self, text: str | bytes) -> int:
        return self.data.count(text.encode() if isinstance(text, str) else text)

    def shows(self, text: str | bytes, count: int = 1, seconds: float = 20) -> bool:
        return wait_for(lambda: self.count(text) >= count, seconds)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace").replace("\r\n", "\n")

    def answer(self, line: str, seconds: float = 20) -> str:
        """Type ``line`` at tsh's prompt; what tsh printed before its next prompt (the echo of
        the line taken off)."""
        prompts = self.count(AGENT_PROMPT)
        self.type(line)
        assert self.shows(AGENT_PROMPT, prompts + 1, seconds), self.text()[-800:]
        echoed = self.text().split(AGENT_PROMPT)[prompts]
        assert echoed.startswith(line + "\n"), (line, echoed)
        return echoed.removeprefix(line + "\n")

    def drain(self, seconds: float = 10) -> tuple[bytes, bool]:
        """For a client that never read: what waits in its socket, and whether EOF followed."""
        data = b""
        self.sock.settimeout(seconds)
        with contextlib.suppress(OSError):
            while chunk := self.sock.recv(65536):
                data += chunk
            return data, True
        return data, False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.reader:
            self.reader.join(timeout=5)
