"""Hand-written clients of an agent terminal's socket (SPEC A-2), for the end-to-end files:
what a third-party client does, byte for byte, beside ``ctx agent watch`` and ``attach``."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.ctxcli import wait_for

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
