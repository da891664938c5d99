"""A tool run on the caller's terminal (T-3) is a job of the shell that started ``ctx run``:
Ctrl-Z stops it and the shell gets its prompt back, ``fg`` lets it go on.  Here what happens
is made to happen in the narrowest places: a Ctrl-Z the moment the runner hands the terminal
to the tool's group (a runner whose ``tcsetpgrp`` sends the group the SIGTSTP a Ctrl-Z typed
then would send), and a tool that reads the terminal before it is handed over (a runner
whose ``tcsetpgrp`` comes late)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

PROMPT = b"job$ "

# The runner, with Ctrl-Z typed the moment the terminal is first the tool's.
CTRL_Z_AT_HANDOVER = """
import os, signal, sys
from cortexfs.tools import spawn

real_tcsetpgrp = os.tcsetpgrp
typed = []

def tcsetpgrp_then_ctrl_z(fd, pgid):
    real_tcsetpgrp(fd, pgid)
    if pgid != os.getpgrp() and not typed:
        typed.append(pgid)
        os.killpg(pgid, signal.SIGTSTP)

os.tcsetpgrp = tcsetpgrp_then_ctrl_z
# Python, which starts nothing: a shell's vfork of a command would hold the shell itself
# unstoppable while the Ctrl-Z stops its child before its exec.
tool = [sys.executable, "-c", "import time; time.sleep(0.5); print('DO' 'NE')"]
"""

# The runner, handing the terminal over only once the tool has tried to read it.
LATE_HANDOVER = """
import os, time
from cortexfs.tools import spawn

real_tcsetpgrp = os.tcsetpgrp

def tcsetpgrp_late(fd, pgid):
    if pgid != os.getpgrp():
        time.sleep(1)
    real_tcsetpgrp(fd, pgid)

os.tcsetpgrp = tcsetpgrp_late
tool = ["/bin/sh", "-c", "read line; echo GOT-$line"]
"""

RUN = """
spec = spawn.ProcessSpec(tool, dict(os.environ), "/", None, 60, network=True)
print("status=%d" % spawn.run_attached(spec).exit_status, flush=True)
"""


class Shell:
    """An interactive bash with job control on a pseudo-terminal, and what it has shown."""

    def __init__(self) -> None:
        self.pid, self.master = pty.fork()
        if self.pid == 0:
            env = {**os.environ, "PS1": PROMPT.decode(), "TERM": "dumb"}
            os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
        self.screen = b""

    def type(self, keys: bytes) -> int:
        os.write(self.master, keys)
        return len(self.screen)

    def shows(self, wanted: bytes, since: int, seconds: float = 30) -> bool:
        deadline = time.monotonic() + seconds
        while wanted not in self.screen[since:]:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([self.master], [], [], left)[0]:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:
                    return False
        return True

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(self.pid), signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.master)


def test_ctrl_z_the_moment_the_tool_is_given_the_terminal_stops_the_job(tmp_path: Path) -> None:
    runner = tmp_path / "runner.py"
    runner.write_text(CTRL_Z_AT_HANDOVER + RUN)
    shell = Shell()
    try:
        assert shell.shows(PROMPT, 0), shell.screen
        mark = shell.type(f"{sys.executable} {runner}\n".encode())
        # Stopped, the job gives the shell its prompt back, and the tool has not gone on.
        assert shell.shows(b"Stopped", mark), shell.screen
        assert shell.shows(PROMPT, mark), shell.screen
        time.sleep(1)
        assert b"DONE" not in shell.screen[mark:], shell.screen
        mark = shell.type(b"fg\n")
        assert shell.shows(b"DONE", mark), shell.screen
        assert shell.shows(b"status=0", mark), shell.screen
    finally:
        shell.close()


def test_a_tool_that_read_the_terminal_before_it_was_handed_over_goes_on(
    tmp_path: Path,
) -> None:
    """Stopped by SIGTTIN while the terminal was still the caller's, the tool is continued
    once it has the terminal, and reads what is typed; the job is not stopped."""
    runner = tmp_path / "runner.py"
    runner.write_text(LATE_HANDOVER + RUN)
    shell = Shell()
    try:
        assert shell.shows(PROMPT, 0), shell.screen
        mark = shell.type(f"{sys.executable} {runner}\n".encode())
        time.sleep(2)  # the tool has read in the background, and has the terminal since
        shell.type(b"abc\n")
        assert shell.shows(b"GOT-abc", mark), shell.screen
        assert shell.shows(b"status=0", mark), shell.screen
        assert b"Stopped" not in shell.screen[mark:], shell.screen
    finally:
        shell.close()


def _lead_a_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is its stdin, as sshd, a
    terminal emulator or ``docker exec -t`` start a program."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_runner_leading_its_terminal_continues_a_tool_that_set_modes_before_handover(
    tmp_path: Path,
) -> None:
    """No shell above: the runner leads the terminal's session itself.  The tool sets the
    terminal's modes before it is handed over (SIGTTOU stops it); it is handed the terminal
    and continued, and the runner returns its status, where it waited for ever."""
    runner = tmp_path / "runner.py"
    runner.write_text(
        LATE_HANDOVER.replace(
            'tool = ["/bin/sh", "-c", "read line; echo GOT-$line"]',
            'tool = ["/bin/sh", "-c", "stty -echo; stty echo; exit 5"]',
        )
        + RUN
    )
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, str(runner)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=_lead_a_terminal,
    )
    os.close(slave)
    try:
        process.wait(timeout=20)
        shown = b""
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        assert b"status=5" in shown, shown
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        os.close(master)
