"""End-to-end flows of an operator at an interactive terminal (SPEC T-3, W-4, Q-5, §2.4, S-2,
A-2, H-1, H-5; docs/tools.md "Terminal CLI mode", "Process group and bounds", "The agent
terminal"; docs/workers.md "Signals"; docs/sessions.md): everything runs on a real
pseudo-terminal, most of it under ``bash -i`` as the session leader, as a person types it.

* ``ctx run`` in terminal mode gives the terminal to the tool's own process group: Ctrl-C and
  Ctrl-\\ reach the tool, and ctx exits with the tool's status and records it; a per-call
  timeout that fires while the tool is stopped still kills it and gives the terminal back;
  an interactive shell run as a tool keeps its own job control.
* Job control of the call itself: Ctrl-Z, ``fg``, ``ctx run … &`` whose tool reads the
  terminal (SIGTTIN) or writes to it under ``stty tostop`` (SIGTTOU).
* Terminal modes: a tool that turns echo and canonical input off and is interrupted, under
  ``ctx run`` and inside an agent's tsh.
* The terminal closing (SIGHUP) under ``ctx run``, under a worker in the foreground, after a
  ``ctx queue claim`` typed at the shell (the lease holder is the shell, §2.4), and under
  ``ctx agent attach``; and ``attach``'s detach key.

Black-box: the installed ``ctx``, ``bash``, real pseudo-terminals, real processes, bubblewrap
sandboxes for the agent terminal."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shlex
import shutil
import signal
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    clean_env,
    ctx_run,
    processes_of,
    request,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, coder_host, tsh_of

SCRATCH = scratch_top(__file__)
CTX = CTX_ARGV[0]
PROMPT = "tty$ "  # the operator's bash prompt
LINE_TOOL = "line"  # a tool that runs its first argument as a shell command line
SHELL_TOOL = "ish"  # an interactive bash as a tool (H-5)
TOOLS = [LINE_TOOL, SHELL_TOOL, "shell.exec"]
DETACH = b"\x1d"  # Ctrl-]
CTRL_C, CTRL_BACKSLASH, CTRL_Z = b"\x03", b"\x1c", b"\x1a"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bash") is None,
    reason="agents run as another uid (nobody): needs root, and bash",
)
needs_agent_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- the host


@pytest.fixture(scope="module")
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` (uid ``nobody``) allowed :data:`TOOLS` in both policies, and ``out``, a
    directory every uid may write."""
    with coder_host(_template, SCRATCH, TOOLS, {}) as host:
        host.install(LINE_TOOL, '#!/bin/sh\nulimit -c 0\nexec /bin/sh -c "$1"\n')
        host.install(SHELL_TOOL, "#!/bin/sh\nexec /bin/bash --norc --noprofile -i\n")
        for tool in TOOLS:
            host.grant_in_tool(tool)
        (host.top / "out").mkdir(mode=0o1777)
        (host.top / "out").chmod(0o1777)
        yield host


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:10]


# ---------------------------------------------------------------------------- the terminal


class Tty:
    """A program on a pseudo-terminal of its own (``pty.fork``: it leads a new session whose
    controlling terminal is the pty).  Its output is read in the calling thread only, so that
    closing the master end really hangs the terminal up."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: become the program at once
            try:
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.data = b""
        self.status: int | None = None
        self.is_open = True

    def _pump(self, seconds: float) -> None:
        if not self.is_open:
            time.sleep(seconds)
            return
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if not ready:
            return
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: nothing holds the terminal's other end any more
            chunk = b""
        if not chunk:
            time.sleep(seconds)
        self.data += chunk

    def until(self, predicate: Callable[[], bool], seconds: float = 15) -> bool:
        """Whether ``predicate()`` holds within ``seconds``, reading output meanwhile."""
        deadline = time.monotonic() + seconds
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            self._pump(0.05)
        return True

    def text(self, since: int = 0) -> str:
        return self.data[since:].decode("utf-8", "replace").replace("\r\n", "\n")

    def shows(self, text: str, since: int = 0, count: int = 1, seconds: float = 15) -> bool:
        return self.until(lambda: self.text(since).count(text) >= count, seconds)

    def type(self, data: bytes | str) -> int:
        """Type ``data``; the offset of the output that follows it."""
        mark = len(self.data)
        os.write(self.fd, data.encode() if isinstance(data, str) else data)
        return mark

    def foreground(self) -> int:
        """The terminal's foreground process group."""
        return os.tcgetpgrp(self.fd)

    def hang_up(self) -> None:
        """Close the terminal, as a terminal emulator or an ssh connection that goes away."""
        os.close(self.fd)
        self.is_open = False

    def ended(self, seconds: float = 15) -> int | None:
        """Its wait status once it has ended, or None."""

        def done() -> bool:
            if self.status is None:
                pid, raw = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.status = raw
            return self.status is not None

        self.until(done, seconds)
        return self.status

    def close(self) -> None:
        """SIGKILL to it and to everything still below it, unless it has ended."""
        if self.status is None:
            for pid in family(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
        if self.is_open:
            self.hang_up()


class Shell(Tty):
    """``bash -i`` on its pty, prompting :data:`PROMPT`, with ``CTX_STORAGE`` set."""

    def prompts(self, since: int = 0) -> int:
        return self.text(since).count(PROMPT)

    def enter(self, line: str, seconds: float = 15) -> str:
        """Type ``line`` and wait for the next prompt: what the line printed."""
        mark = self.type(line + "\n")
        assert self.until(lambda: self.prompts(mark) >= 1, seconds), self.text()
        return self.text(mark)

    def last_status(self) -> int:
        """``$?`` of the last command."""
        out = self.enter("echo status=$?")
        found = re.search(r"status=(\d+)\n", out)
        assert found, out
        return int(found.group(1))


@contextlib.contextmanager
def interactive_shell(host: CoderHost) -> Iterator[Shell]:
    env = clean_env(CTX_STORAGE=str(host.storage), PS1=PROMPT, TERM="dumb", HISTFILE="/dev/null")
    shell = Shell(["/bin/bash", "--norc", "--noprofile", "-i"], env, host.top)
    try:
        assert shell.shows(PROMPT), shell.text()
        yield shell
    finally:
        shell.close()


def run_line(session: str, script: str, *options: str) -> str:
    """The ``ctx run`` command line of :data:`LINE_TOOL` running ``script``."""
    return f"{CTX} run --agent coder --session {session} {' '.join(options)} {LINE_TOOL} " + (
        shlex.quote(script)
    )


def cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def state(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return ""


def tool_processes(marker: str) -> list[int]:
    """The live processes of a call's tool (its shell, started by :data:`LINE_TOOL`) whose
    command line holds ``marker``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        line = cmdline(int(entry))
        if line.startswith(b"/bin/sh\0-c\0") and marker.encode() in line and alive(int(entry)):
            found.append(int(entry))
    return found


def tool_has_terminal(tty: Tty, marker: str) -> bool:
    """Whether the terminal's foreground group is the tool's (``ctx run`` handed it over)."""
    return tty.foreground() in tool_processes(marker)


def tool_sleeps(marker: str) -> bool:
    """Whether the call's tool has reached the ``sleep`` its command line ends with (a key
    typed before would reach its shell between two commands)."""
    for pid in tool_processes(marker):
        with contextlib.suppress(psutil.Error):
            if any(child.name() == "sleep" for child in psutil.Process(pid).children()):
                return True
    return False


def tool_stopped(marker: str) -> bool:
    return any(state(pid) == "T" for pid in tool_processes(marker))


def family(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    with contextlib.suppress(psutil.Error):
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    return [pid]


def none_alive(pids: list[int], seconds: float = 15) -> bool:
    return wait_for(lambda: not any(alive(p) for p in pids), seconds)


def call_events(host: CoderHost, session: str) -> tuple[list[dict], list[dict]]:
    """The ``tool_call`` and ``tool_result`` events of :data:`LINE_TOOL` in ``session``."""
    events = host.calls(session, LINE_TOOL)
    return (
        [e for e in events if e["type"] == "tool_call"],
        [e for e in events if e["type"] == "tool_result"],
    )


# ------------------------------------------------------------------- interrupts and modes


@pytest.mark.parametrize(
    ("key", "signum"), [(CTRL_C, signal.SIGINT), (CTRL_BACKSLASH, signal.SIGQUIT)]
)
def test_interrupt_keys_reach_the_tool_and_ctx_run_exits_with_its_status(host, tag, key, signum):
    """T-3, docs/tools.md "Terminal CLI mode": the tool is the terminal's foreground group, so
    Ctrl-C (SIGINT) and Ctrl-\\ (SIGQUIT) typed while it runs reach it and not ctx; ctx exits
    with the tool's status (128 + N, as a shell reports it), records exactly that in the
    session, prints no interruption of its own, and leaves nothing of the call running."""
    marker = f"{host.top}/{tag}"
    with interactive_shell(host) as shell:
        mark = shell.type(run_line(tag, f"echo RE''ADY; sleep 30 # {marker}") + "\n")
        assert shell.shows("READY", mark), shell.text()
        assert shell.until(lambda: tool_has_terminal(shell, marker) and tool_sleeps(marker)), (
            shell.text()
        )
        shell.type(key)
        assert shell.until(lambda: shell.prompts(mark) >= 1), shell.text()
        assert shell.last_status() == 128 + signum, shell.text()
        assert "ctx: EINTR" not in shell.text(mark) and "Traceback" not in shell.text(mark)
        assert wait_for(lambda: not tool_processes(marker)), tool_processes(marker)
    calls, results = call_events(host, tag)
    assert len(calls) == len(results) == 1, (calls, results)
    assert results[0]["call"] == calls[0]["call"], results
    assert results[0]["status"] == "error" and results[0]["exit_status"] == 128 + signum


def test_a_timeout_kills_a_stopped_tool_and_gives_the_terminal_back(host, tag):
    """docs/tools.md "Process group and bounds", T-3: under a shell without job control
    (``sh -c``, ctx in the session leader's group), Ctrl-Z stops the tool; its ``--timeout``
    still kills the stopped group with SIGKILL: ``ctx: ETIMEDOUT`` and exit 137, the result
    recorded so, nothing left, and the terminal's foreground group is the caller's again."""
    marker = f"{host.top}/{tag}"
    # The tool says READY once it leads the terminal: ctx's SIGCONT on the hand-over is past.
    waits = "until [ $(ps -o tpgid= -p $$) -eq $$ ]; do sleep 0.01; done"
    call = run_line(tag, f"{waits}; echo RE''ADY; sleep 30 # {marker}", "--timeout", "2")
    script = f'{call}; echo "status=$?"; echo "groups=$(ps -o pgid= -o tpgid= -p $$)"'
    env = clean_env(CTX_STORAGE=str(host.storage), TERM="dumb")
    tty = Tty(["/bin/sh", "-c", script], env, host.top)
    try:
        assert tty.shows("READY"), tty.text()
        assert tty.until(lambda: tool_has_terminal(tty, marker) and tool_sleeps(marker)), tty.text()
        tty.type(CTRL_Z)
        assert tty.until(lambda: tool_stopped(marker), 1.5), tty.text()  # before the timeout
        assert tty.shows("groups="), tty.text()
        out = tty.text()
        assert "status=137" in out and "ctx: ETIMEDOUT: timed out after 2s" in out, out
        group, foreground = re.search(r"groups=\s*(\d+)\s+(\d+)", out).groups()
        assert group == foreground == str(tty.pid), out
        assert wait_for(lambda: not tool_processes(marker)), tool_processes(marker)
    finally:
        tty.close()
    calls, results = call_events(host, tag)
    assert len(calls) == len(results) == 1, (calls, results)
    assert results[0]["errno"] == "ETIMEDOUT" and results[0]["exit_status"] == 137, results


def test_an_interactive_shell_run_as_a_tool_keeps_its_own_job_control(host, tag):
    """H-5, T-3: ``bash -i`` run as a tool through ``ctx run`` leads the terminal: Ctrl-Z
    stops its job (``Stopped``), ``fg`` resumes it, Ctrl-C ends it and the shell lives on;
    ``exit`` returns to the operator's shell with status 0 and the terminal's modes as they
    were."""
    with interactive_shell(host) as shell:
        shell.enter(f"stty -a > {host.top}/modes-before-{tag}")
        mark = shell.type(f"{CTX} run --agent coder --session {tag} {SHELL_TOOL}\n")
        assert shell.shows("$ ", mark), shell.text()
        mark = shell.type("PS1='in''ner> '\n")
        assert shell.shows("inner> ", mark), shell.text()
        naps = f"sleep 1000.{int(tag, 16) % 10**9}"  # a command line of its own to look for

        def nap(wanted: str) -> bool:
            return any(state(p) == wanted for p in processes_of(Path(naps.split()[1])))

        mark = shell.type(naps + "\n")
        assert shell.until(lambda: nap("S")), shell.text()
        shell.type(CTRL_Z)
        assert shell.until(lambda: nap("T")), shell.text()
        assert shell.shows("Stopped", mark) and shell.shows("inner> ", mark), shell.text()
        mark = shell.type("fg\n")
        assert shell.shows(naps, mark) and shell.until(lambda: nap("S")), shell.text()
        shell.type(CTRL_C)
        assert shell.shows("inner> ", mark), shell.text()
        assert wait_for(lambda: not nap("S") and not nap("T")), shell.text()
        mark = shell.type("exit 0\n")
        assert shell.until(lambda: shell.prompts(mark) >= 1), shell.text()
        assert shell.last_status() == 0, shell.text()
        shell.enter(f"stty -a > {host.top}/modes-after-{tag}")
    before = (host.top / f"modes-before-{tag}").read_text()
    assert (host.top / f"modes-after-{tag}").read_text() == before


def test_ctrl_z_suspends_the_call_to_the_shell_and_fg_resumes_it(host, tag):
    """T-3, docs/tools.md: "on a terminal the tool becomes the foreground process group so
    that Ctrl-C and job control reach it".  Ctrl-Z while a tool runs suspends the job as for
    any command a shell runs: the prompt comes back, and ``fg`` lets the tool finish, ctx
    exiting 0.

    The tool waits in a builtin ``read``: a shell that starts a command (dash starts them
    with vfork) cannot stop until that command has started, while the child a Ctrl-Z stopped
    before its exec never starts, so no shell above sees the job stop (the shell that
    started ``ctx run`` would not see it either, were the tool its own job).  Its ``read``
    may come before ``ctx run`` has handed it the terminal, which stops it (SIGTTIN) until
    ctx continues it: the key is typed once it reads, as a person types at a prompt."""
    marker = f"{host.top}/{tag}"
    script = f"echo RE''ADY; read line; echo DO''NE-$line # {marker}"
    with interactive_shell(host) as shell:
        mark = shell.type(run_line(tag, script) + "\n")
        assert shell.shows("READY", mark), shell.text()

        def reading() -> bool:
            return tool_has_terminal(shell, marker) and not tool_stopped(marker)

        assert shell.until(reading), shell.text()
        shell.type(CTRL_Z)
        assert shell.until(lambda: shell.prompts(mark) >= 1), shell.text()
        mark = shell.type("fg\n")
        assert shell.until(reading), shell.text()
        shell.type("go\n")
        assert shell.shows("DONE-go", mark) and shell.until(lambda: shell.prompts(mark) >= 1)
        assert shell.last_status() == 0, shell.text()


@pytest.mark.parametrize("touch", ["reads", "writes"])
def test_a_background_call_whose_tool_needs_the_terminal_goes_on_after_fg(host, tag, touch):
    """T-3: ``ctx run … &`` whose tool reads the terminal (SIGTTIN) or writes to it under
    ``stty tostop`` (SIGTTOU) is stopped by the kernel, as any background job is; ``fg``
    brings the job to the foreground and the tool reads what is typed, or writes, and the
    call ends with status 0."""
    marker = f"{host.top}/{tag}"
    with interactive_shell(host) as shell:
        if touch == "reads":
            script, typed, expected = f"read x; echo GOT-$x # {marker}", "abc\n", "GOT-abc"
        else:
            shell.enter("stty tostop")
            script, typed, expected = f"echo WR''OTE # {marker}", "", "WROTE"
        shell.enter(run_line(tag, script) + " &")
        assert shell.until(lambda: tool_stopped(marker)), shell.text()
        mark = shell.type("fg\n")
        shell.until(lambda: shell.foreground() != shell.pid, 3)  # best effort: fg has begun
        shell.type(typed)
        assert shell.shows(expected, mark), shell.text()
        assert shell.until(lambda: shell.prompts(mark) >= 1), shell.text()
        assert shell.last_status() == 0, shell.text()


def test_an_interrupted_tool_that_turned_echo_off_leaves_the_terminal_as_it_was(host, tag):
    """T-3, docs/tools.md ("as a shell's job would"): bash restores the terminal's modes after
    a foreground job that a signal killed.  Through ``ctx run`` the tool is the job: after
    Ctrl-C ends a tool that had turned echo and canonical input off, ``stty -a`` at the prompt
    shows the modes it showed before the call."""
    marker = f"{host.top}/{tag}"
    with interactive_shell(host) as shell:
        shell.enter(f"stty -a > {host.top}/modes-before-{tag}")
        mark = shell.type(run_line(tag, f"stty -echo -icanon; echo RE''ADY; sleep 30 # {marker}"))
        shell.type("\n")
        assert shell.shows("READY", mark), shell.text()
        assert shell.until(lambda: tool_has_terminal(shell, marker) and tool_sleeps(marker)), (
            shell.text()
        )
        shell.type(CTRL_C)
        assert shell.until(lambda: shell.prompts(mark) >= 1), shell.text()
        assert shell.last_status() == 130
        shell.enter(f"stty -a > {host.top}/modes-after-{tag}")
    before = (host.top / f"modes-before-{tag}").read_text()
    after = (host.top / f"modes-after-{tag}").read_text()
    assert " echo " in before and " icanon " in before, before
    assert after == before, after


# ----------------------------------------------------------------------- closing terminal


def test_a_closing_terminal_ends_ctx_run_and_its_tool_and_the_call_is_recorded(host, tag):
    """docs/tools.md, docs/sessions.md, S-2: the terminal closes (SIGHUP) while ``ctx run``
    runs a tool in the foreground of ``bash -i``: the shell, ctx, the tool and everything
    under them end, and the session holds the call's ``tool_result`` beside its
    ``tool_call``."""
    marker = f"{host.top}/{tag}"
    with interactive_shell(host) as shell:
        mark = shell.type(run_line(tag, f"echo RE''ADY; sleep 30 # {marker}") + "\n")
        assert shell.shows("READY", mark), shell.text()
        assert shell.until(lambda: tool_has_terminal(shell, marker)), shell.text()
        everything = family(shell.pid)
        assert len(everything) >= 3, everything  # bash, ctx, the tool (and what they started)
        shell.hang_up()
        assert shell.ended() is not None
        assert none_alive(everything), [p for p in everything if alive(p)]
    calls, results = call_events(host, tag)
    assert len(calls) == len(results) == 1, (calls, results)
    assert results[0]["call"] == calls[0]["call"] and results[0]["status"] == "error", results


@pytest.mark.parametrize("tool", ["dies of the hangup", "ignores the hangup and finishes"])
def test_a_call_whose_terminal_closed_is_recorded_as_the_tool_ended(host, tag, tool):
    """S-2, docs/sessions.md, docs/tools.md (``exit_status`` null only "when it never ran"):
    the terminal closes while the tool runs.  A tool that dies of the SIGHUP, or one that
    ignores it and finishes its work, ran: its ``tool_result`` carries an exit status and
    does not say the tool could not start."""
    marker = f"{host.top}/{tag}"
    finished = host.top / "out" / f"finished-{tag}"
    if tool == "dies of the hangup":
        script = f"echo RE''ADY; sleep 30 # {marker}"
    else:
        script = f"trap '' HUP; echo RE''ADY; sleep 1; touch {finished} # {marker}"
    with interactive_shell(host) as shell:
        mark = shell.type(run_line(tag, script) + "\n")
        assert shell.shows("READY", mark), shell.text()
        assert shell.until(lambda: tool_has_terminal(shell, marker)), shell.text()
        everything = family(shell.pid)
        shell.hang_up()
        assert shell.ended() is not None
        assert none_alive(everything), [p for p in everything if alive(p)]
    if tool != "dies of the hangup":
        assert finished.exists()  # it did its work to the end
    calls, results = call_events(host, tag)
    assert len(calls) == len(results) == 1, (calls, results)
    assert results[0]["exit_status"] is not None, results
    assert "cannot start" not in (results[0].get("message") or ""), results


def test_a_worker_in_the_foreground_of_a_closing_terminal_finishes_its_job(host, tag):
    """W-4, Q-5, docs/workers.md "Signals": ``ctx queue work`` runs in the foreground of
    ``bash -i`` when the terminal closes: it claims nothing more, the running job finishes in
    ``done/`` once, the next stays pending, nothing is left claimed or running, and recover
    finds nothing to do."""
    project = f"p{tag}"
    made = host.ctx("queue", "init", "--project", project)
    assert made.rc == 0, made
    queue = QueueCLI(host.storage, project)
    out = host.top / "out"
    for name in ("a", "b"):
        job = request("shell.exec", tag=name)
        job["input"] = {"cmd": f"touch {out}/{tag}-started-{name}; sleep 1; echo ran >> "
                                 f"{out}/{tag}-ran-{name}"}  # fmt: skip
        queue.publish(job, name=name)
    with interactive_shell(host) as shell:
        shell.type(f"{CTX} queue work --project {project} --agent coder --session w{tag}\n")
        assert shell.until(lambda: (out / f"{tag}-started-a").exists()), shell.text()
        everything = family(shell.pid)
        shell.hang_up()
        assert shell.ended() is not None
        assert none_alive(everything), [p for p in everything if alive(p)]
    assert (out / f"{tag}-ran-a").read_text() == "ran\n"
    assert not (out / f"{tag}-started-b").exists()
    assert queue.state("a.req.json") == "done" and queue.state("b.req.json") == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    recover = queue.run("recover", "--dry-run", "--json")
    assert recover.rc == 0 and recover.json()["requeued"] == [], recover


def test_a_claim_typed_at_a_shell_is_held_by_the_shell_until_its_terminal_closes(host, tag):
    """§2.4, Q-5: ``ctx queue claim`` typed at ``bash -i`` leases the job on behalf of the
    shell (its parent): recover leaves it while the shell lives; once the terminal closes and
    the shell is gone, recover puts it back in ``pending/`` and it can be claimed again."""
    project = f"p{tag}"
    made = host.ctx("queue", "init", "--project", project)
    assert made.rc == 0, made
    queue = QueueCLI(host.storage, project)
    job = queue.publish(name="typed")
    with interactive_shell(host) as shell:
        out = shell.enter(f"{CTX} queue claim --project {project}")
        assert f"\n{job}\n" in out, out
        assert shell.last_status() == 0
        assert queue.lease(job)["pid"] == shell.pid, queue.lease(job)
        untouched = queue.run("recover", "--json")
        assert untouched.rc == 0 and untouched.json()["requeued"] == [], untouched
        assert queue.state(job) == "claimed"
        shell.hang_up()
        assert shell.ended() is not None
    recovered = queue.run("recover", "--json")
    assert recovered.rc == 0, recovered
    assert [e["job"] for e in recovered.json()["requeued"]] == [job], recovered
    assert queue.state(job) == "pending"
    assert queue.claim() == job


# ------------------------------------------------------------------------ agent terminal


@contextlib.contextmanager
def agent_terminal(host: CoderHost, tag: str) -> Iterator[str]:
    """A terminal of agent ``coder`` in session ``tag``, stopped at the end."""
    term = host.start(tag)
    try:
        yield term.session
    finally:
        ctx_run("agent", "stop", "coder", "--session", tag, env=host.env)


@needs_agent_terminal
def test_attach_detach_key_gives_the_terminal_back_as_it_was(host, tag):
    """A-2, docs/tools.md ("Ctrl-] detaches"): ``ctx agent attach`` typed at ``bash -i`` takes
    the terminal raw while attached (no signal keys: Ctrl-C is the agent's), the typed
    ``tools`` reaches tsh; Ctrl-] detaches with status 0, ``stty -a`` shows the modes it
    showed before, and the agent's terminal runs on."""
    with agent_terminal(host, tag) as session, interactive_shell(host) as shell:
        shell.enter(f"stty -a > {host.top}/modes-before-{tag}")
        mark = shell.type(f"{CTX} agent attach coder --session {session}\n")
        assert shell.shows(AGENT_PROMPT, mark), shell.text()
        assert not termios.tcgetattr(shell.fd)[3] & termios.ISIG
        mark = shell.type("tools\n")
        assert shell.shows(LINE_TOOL, mark) and shell.shows(AGENT_PROMPT, mark), shell.text()
        mark = shell.type(DETACH)
        assert shell.until(lambda: shell.prompts(mark) >= 1), shell.text()
        assert shell.last_status() == 0, shell.text()
        shell.enter(f"stty -a > {host.top}/modes-after-{tag}")
        assert termios.tcgetattr(shell.fd)[3] & termios.ISIG
        assert alive(tsh_of(session))
    before = (host.top / f"modes-before-{tag}").read_text()
    assert (host.top / f"modes-after-{tag}").read_text() == before


@needs_agent_terminal
def test_a_closing_terminal_ends_attach_but_not_the_agent_terminal(host, tag):
    """A-2, docs/tools.md: the operator's terminal closes while ``ctx agent attach`` runs in
    it: the shell and attach end and nothing of them is left, while the agent's terminal,
    which ctxterm owns, runs on and takes a new client."""
    with agent_terminal(host, tag) as session:
        agent_shell = tsh_of(session)
        with interactive_shell(host) as shell:
            mark = shell.type(f"{CTX} agent attach coder --session {session}\n")
            assert shell.shows(AGENT_PROMPT, mark), shell.text()
            everything = family(shell.pid)
            assert len(everything) >= 2, everything
            shell.hang_up()
            assert shell.ended() is not None
            assert none_alive(everything), [p for p in everything if alive(p)]
        assert alive(agent_shell)
        again = Tty([CTX, "agent", "attach", "coder", "--session", session], host.env, host.top)
        try:
            assert again.shows(AGENT_PROMPT), again.text()
            assert again.until(lambda: not termios.tcgetattr(again.fd)[3] & termios.ISIG)
            mark = again.type("tools\n")
            assert again.shows(LINE_TOOL, mark), (again.text(), host.events(session)[-3:])
            again.type(DETACH)
            assert again.ended() is not None and os.waitstatus_to_exitcode(again.status) == 0
        finally:
            again.close()


@needs_agent_terminal
def test_ctrl_c_in_tsh_leaves_the_agent_terminal_echoing(host, tag):
    """T-3, H-1, docs/tools.md: "Ctrl-C … while a tool runs it interrupts that tool (…, exit
    status 130), never the terminal".  A tool that turned echo and canonical input off and is
    interrupted leaves the agent's PTY as it was: the next tool finds echo on."""
    marker = f"{host.top}/{tag}"
    script = f'stty -echo -icanon; echo RE""ADY; sleep 30 # {marker}'
    with agent_terminal(host, tag) as session:
        attached = Tty([CTX, "agent", "attach", "coder", "--session", session], host.env,
                       host.top)  # fmt: skip
        try:
            assert attached.shows(AGENT_PROMPT), attached.text()
            assert attached.until(lambda: not termios.tcgetattr(attached.fd)[3] & termios.ISIG)
            mark = attached.type(f"{LINE_TOOL} {shlex.quote(script)}\n")
            assert attached.shows("READY", mark), attached.text()
            assert attached.until(lambda: tool_sleeps(marker)), attached.text()
            attached.type(CTRL_C)
            assert attached.shows(AGENT_PROMPT, mark), attached.text()
            probe = (
                'if stty -a | grep -q -- " -echo "; then echo MODE-O""FF; else echo MODE-O""N; fi'
            )
            mark = attached.type(f"{LINE_TOOL} {shlex.quote(probe)}\n")
            # The answer on a line of its own, not the typed line echoed (which holds MODE-O).
            answered = re.compile(r"^MODE-O(?:N|FF)\s*$", re.M)
            assert attached.until(lambda: answered.search(attached.text(mark))), attached.text()
            attached.type(DETACH)
            attached.ended()
        finally:
            attached.close()
    results = [e for e in host.calls(tag, LINE_TOOL, "tool_result")]
    assert [e["exit_status"] for e in results] == [130, 0], results
    assert "MODE-ON" in attached.text(mark), attached.text(mark)
