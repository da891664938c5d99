"""tsh at a terminal reads a command line whole, however long, with the usual line editing
(see cortexfs/tools/core/tsh_line.py): the real ``bin/tsh`` of a bootstrapped root, on a
pseudo-terminal, typed at as a person types, one line after each prompt."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.storage import copy_of_root

PROMPT = b"tsh$ "
KERNEL_LINE_LIMIT = 4095  # what a terminal's canonical mode keeps of a line (N_TTY_BUF_SIZE - 1)


class Terminal:
    """A standalone tsh on a pseudo-terminal, and what it has shown."""

    def __init__(self, root: Path) -> None:
        self.pid, self.master = pty.fork()
        if self.pid == 0:  # the child: tsh, as a person starts it
            env = {"PATH": "/usr/bin:/bin", "CTX_PATH": str(root / "tool"), "LANG": "C.UTF-8"}
            os.execve(str(root / "bin" / "tsh"), [str(root / "bin" / "tsh")], env)
        self.screen = b""

    def read_until(self, ending: bytes, since: int | None = None, seconds: float = 20) -> bytes:
        """What tsh shows from offset ``since`` (here, by default) of the screen up to and
        including ``ending``."""
        start = len(self.screen) if since is None else since
        deadline = time.monotonic() + seconds
        while not self.screen[start:].endswith(ending):
            left = deadline - time.monotonic()
            assert left > 0, self.screen[-300:]
            if select.select([self.master], [], [], left)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the terminal's other side is closed: tsh has ended
                    chunk = b""
                assert chunk, self.screen[-300:]
                self.screen += chunk
        return self.screen[start:]

    def type(self, keys: bytes) -> bytes:
        """Type ``keys`` at the prompt; what tsh shows until its next prompt."""
        start = len(self.screen)
        for offset in range(0, len(keys), 1024):  # no faster than the terminal takes them
            os.write(self.master, keys[offset : offset + 1024])
            while select.select([self.master], [], [], 0)[0]:
                self.screen += os.read(self.master, 65536)
        return self.read_until(PROMPT, since=start)

    def exit_status(self) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if select.select([self.master], [], [], 0.05)[0]:
                with contextlib.suppress(OSError):  # tsh's side is closed
                    self.screen += os.read(self.master, 65536)
        raise AssertionError("tsh did not end")

    def close(self) -> None:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.master)


@pytest.fixture
def terminal(bootstrapped_by_ctx: Path, tmp_path: Path) -> Iterator[Terminal]:
    root = copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")
    term = Terminal(root)
    try:
        term.read_until(PROMPT)
        yield term
    finally:
        term.close()


def test_a_line_longer_than_the_terminals_own_line_limit_reaches_tsh_whole(terminal) -> None:
    """A terminal's line editing keeps 4095 bytes of a line and drops the rest, which cut an
    ``agent.update`` of a long prompt into an unclosed quotation; tsh reads the line itself."""
    name = b"a" * (KERNEL_LINE_LIMIT + 2000) + b"Z"
    shown = terminal.type(b"which " + name + b"\r")
    # The message cuts a word that long, saying how long it was: all of it reached tsh.
    said = b"tsh: " + name[:256] + f"\u2026 ({len(name)} characters)".encode()
    assert said + b": not on CTX_PATH\r\n" in shown, shown[-200:]
    assert shown.startswith(b"which " + name + b"\r\n"), shown[:40]  # echoed as typed

    shown = terminal.type(b"which 'fs.read\r")  # an unclosed quotation is still said as such
    assert b"No closing quotation" in shown, shown


def test_erase_word_erase_and_kill_edit_the_line_before_it_runs(terminal) -> None:
    """DEL erases a character (a UTF-8 sequence being one), Ctrl-W a word, Ctrl-U the line;
    each is wiped from the screen, as the terminal's own line editing does."""
    root_tool = b"/tool/fs."
    shown = terminal.type(b"which fs.re\x7fead junk\x17fs.stat\x15which fs.list \xc3\xa9\x7f\r")
    assert shown.count(b"\b \b") == 1 + 4 + len(b"which fs.read fs.stat") + 1, shown
    out = shown.split(b"\r\n", 1)[1]
    assert out.endswith(root_tool + b"list\r\n" + PROMPT), out  # only fs.list was asked for
    assert b"read" not in out and b"stat" not in out, out


def test_ctrl_c_drops_the_line_and_ctrl_d_on_an_empty_line_ends_tsh(terminal) -> None:
    """Ctrl-C stays the terminal's signal: the half-typed line is dropped and shown as ``^C``;
    Ctrl-D in the middle of a line does nothing, on an empty line it is the end of input."""
    # The signal also empties what the terminal had yet to send (the echo, here), unless
    # its reader was quicker: the end is the same.
    shown = terminal.type(b"which fs.read\x03")
    assert shown.endswith(b"^C\r\n" + PROMPT), shown
    shown = terminal.type(b"which fs.\x04stat\r")
    assert shown.endswith(b"/tool/fs.stat\r\n" + PROMPT), shown
    os.write(terminal.master, b"\x04")
    assert terminal.exit_status() == 0
