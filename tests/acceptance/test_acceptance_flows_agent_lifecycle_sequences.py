"""The commands of an agent's life run in unusual orders and at the same time, as a team of
operators runs them (SPEC §8 A-1, A-2, A-3; §4 S-1, S-2, S-4; §5 P-5, P-6; docs/tools.md "The
agent terminal", docs/mount.md "What each view shows"): ``ctx agent create`` again under the
same name, with the same and with a changed request, and from several shells at once;
``ctx agent start`` twice in a row and from several shells at once; ``ctx agent stop`` twice
and at once; a stop while a tool call runs in the terminal; a start after the terminal was
killed (its view still mounted, its mount process running, its sockets stale), after its view
was lazily unmounted by hand, after its mount process was killed; ``watch`` and ``attach``
while it stops; ``ctx run --agent`` in the terminal's session while the terminal runs a call;
policy edits while a call runs; the agent's user deleted between create and start;
``ctx bootstrap`` reinstalling the tool tier and ``bin/tsh`` under a running terminal; and a
small state machine over start, stop, kill, lazy unmount and calls.

Each command must succeed, or refuse with an errno-style message that says what to do; leave
nothing behind (daemons, mounts, sockets, half-made agents); ``ctx agent list``/``show`` must
tell the truth; and every call must be recorded once in its session.  Black-box: the
installed ``ctx``, real processes, PTYs, sockets, uids, FUSE views and bubblewrap sandboxes;
every mount and process a test made is removed at its end."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    alive,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import CoderHost, Raw, coder_host

SCRATCH = scratch_top(__file__)
PROMPT = "coder$ "
NOTE = "the note kept in the operator's workspace"
TOOLS = ["fs.read", "nap", "tick"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("bwrap") is None
    or not os.path.exists("/dev/fuse")
    or shutil.which("useradd") is None,
    reason="an agent terminal needs root, bubblewrap, /dev/fuse (and useradd for one test)",
)


# ---------------------------------------------------------------------------------- helpers


class Life:
    """Agent ``coder`` of a :class:`CoderHost`, driven by the lifecycle commands, with what
    each terminal it started left on the machine: its runtime directory (the pid file, the
    sockets, the view's mount point) and the pid of its ctxterm."""

    def __init__(self, host: CoderHost) -> None:
        self.host = host
        self.key_dir: Path | None = None  # /run/cortexfs/terminal/<root key>
        self.ctxterms: set[int] = set()

    # -- commands

    def ctx(self, *args: str) -> Run:
        return self.host.ctx(*args, cwd=self.host.ws)

    def start(self, session: str) -> Run:
        started = self.ctx("agent", "start", "coder", "--session", session, "--json")
        if started.rc == 0:
            self.host.started.append(session)
            rundir = Path(started.json()["listening_at"]).parent
            self.key_dir = rundir.parents[2]
            self.ctxterms.add(self.pid(session))
        return started

    def stop(self, session: str) -> Run:
        return self.ctx("agent", "stop", "coder", "--session", session)

    def run(self, session: str, tool: str, *args: str) -> Run:
        return self.ctx("run", "--agent", "coder", "--session", session, tool, *args)

    # -- what is on the machine

    def rundir(self, session: str) -> Path:
        assert self.key_dir is not None, "no terminal was started yet"
        return self.key_dir / str(self.host.uid) / "coder" / session

    def view(self, session: str) -> Path:
        return self.rundir(session) / "private" / "ctx"

    def pid(self, session: str) -> int:
        return int((self.rundir(session) / "pid").read_text())

    def mounts(self, below: Path | None = None) -> list[str]:
        """Mount points at or below ``below`` (the root's runtime directory by default)."""
        top = str(below or self.key_dir)
        with open("/proc/self/mountinfo") as table:
            points = [line.split()[4] for line in table]
        return [p for p in points if p == top or p.startswith(top + "/")]

    def processes(self, below: Path | None = None) -> list[int]:
        """Live processes naming ``below`` (the root's runtime directory by default) in their
        command line (mount processes, bubblewrap), and live ctxterms this test started."""
        top = str(below or self.key_dir).encode()
        found = [pid for pid in self.ctxterms if alive(pid)] if below is None else []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if top in Path(f"/proc/{entry}/cmdline").read_bytes() and alive(int(entry)):
                    found.append(int(entry))
        return sorted(set(found))

    def leftovers(self, session: str) -> dict[str, object]:
        """What of a terminal of ``session`` is still there: nothing, once it has ended."""
        rundir = self.rundir(session)
        link = self.host.session_dir(session) / "terminal" / "main.sock"
        return {
            k: v
            for k, v in {
                "mounts": self.mounts(rundir),
                "processes": self.processes(rundir),
                "rundir": rundir.exists(),
                "link": os.path.lexists(link),
            }.items()
            if v
        }

    def remains(self) -> dict[str, object]:
        """What remains of this root's terminals (mounts, processes, the runtime directory)."""
        if self.key_dir is None:
            return {}
        remains = {
            "mounts": self.mounts(),
            "processes": [described(pid) for pid in self.processes()],
            "rundir": sorted(str(p) for p in self.key_dir.rglob("*")) or self.key_dir.exists(),
        }
        return {k: v for k, v in remains.items() if v}

    def nothing_left(self) -> dict[str, object]:
        """What still remains of this root's terminals a few seconds on (a ctxterm may take
        some milliseconds to be gone after the stop that ended it returned): empty when
        nothing does."""
        wait_for(lambda: not self.remains(), 10)
        return self.remains()

    def kill_terminal(self, session: str) -> int:
        """``kill -9`` the ctxterm of ``session``, waited for until it is gone."""
        pid = self.pid(session)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not alive(pid), 10), pid
        return pid

    # -- what was recorded

    def calls(self, session: str, tool: str) -> dict[str, list[str]]:
        """Call id to the kinds of events (``tool_call``, ``tool_result``) ``session``
        recorded for ``tool``."""
        seen: dict[str, list[str]] = {}
        for event in self.host.calls(session, tool):
            seen.setdefault(event["call"], []).append(event["type"])
        return seen

    def results(self, session: str, tool: str) -> list[dict]:
        return self.host.calls(session, tool, "tool_result")

    def lifecycle_types(self, session: str) -> list[str]:
        return [e["type"] for e in self.host.lifecycle(session)]

    def scrub(self) -> None:
        """Whatever the test left despite the stops: unmounted lazily; killed, with every
        process whose command line or environment names this host's directory (the calls
        of a killed terminal, their tools)."""
        if self.key_dir is not None:
            for point in reversed(self.mounts()):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        mark = str(self.host.top).encode()
        strays = set(self.processes()) if self.key_dir is not None else set()
        for entry in filter(str.isdigit, os.listdir("/proc")):
            if int(entry) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                named = Path(f"/proc/{entry}/cmdline").read_bytes()
                named += Path(f"/proc/{entry}/environ").read_bytes()
                if mark in named and alive(int(entry)):
                    strays.add(int(entry))
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def described(pid: int) -> str:
    """``pid`` with its state and command line, as ``ps`` would show them."""
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return f"{pid} {state} {command[:160]}"
    return f"{pid} (gone)"


def recorded_once(calls: dict[str, list[str]]) -> bool:
    """Each call has exactly one ``tool_call`` and one ``tool_result``, in that order."""
    return all(kinds == ["tool_call", "tool_result"] for kinds in calls.values())


def attach(life: Life, session: str) -> Raw:
    client = Raw(life.rundir(session) / "main.sock", b"attach\n")
    assert client.shows(PROMPT), client.text()
    return client


def nap_program(ws: Path) -> str:
    """Tool ``nap ID``: says it began (with its pid), then waits until ``ws/go.ID`` exists
    (or ``ws`` is gone)."""
    return (
        "#!/bin/sh\n"
        'echo "nap $1 begins $$"\n'
        f'while [ ! -e "{ws}/go.$1" ] && [ -d "{ws}" ]; do sleep 0.02; done\n'
        'echo "nap $1 ends"\n'
    )


def go(life: Life, ident: str) -> None:
    (life.host.ws / f"go.{ident}").write_text("")


def agent_policy(life: Life) -> Path:
    return life.host.storage / "agent" / "coder.d" / "policy"


def replace_text(path: Path, text: str) -> None:
    """``path`` rewritten as an editor saving it does: a new file renamed over the old one."""
    temp = path.with_name(path.name + ".new")
    temp.write_text(text)
    os.chmod(temp, path.stat().st_mode & 0o7777)
    os.rename(temp, path)


class Reader:
    """``ctx agent watch|attach coder`` on pipes, its output read in a thread."""

    def __init__(self, life: Life, verb: str, session: str) -> None:
        argv = [*CTX_ARGV, "agent", verb, "coder", "--session", session]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=life.host.env, start_new_session=True,
        )  # fmt: skip
        self.data = b""
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.data += chunk

    def shows(self, text: str) -> bool:
        return wait_for(lambda: text.encode() in self.data, 20)

    def ended(self) -> tuple[int, str]:
        assert self.proc.stderr is not None
        self.proc.wait(timeout=20)
        self.reader.join(timeout=5)
        return self.proc.returncode, self.proc.stderr.read().decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]


def useradd(name: str) -> pwd.struct_passwd:
    """A new system user ``name`` (tried again while another process holds the passwd lock)."""
    for _ in range(20):
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            check=False,
        )
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
        wait_for(lambda: False, 0.2)
    pytest.skip(f"cannot create the user {name}")


def userdel(name: str) -> None:
    for _ in range(20):
        subprocess.run(["userdel", name], capture_output=True, check=False)
        try:
            pwd.getpwnam(name)
        except KeyError:
            return
        wait_for(lambda: False, 0.2)


# ---------------------------------------------------------------------------------- fixture


@pytest.fixture
def life(_template: Path) -> Iterator[Life]:
    """Agent ``coder`` (uid nobody) allowed ``fs.read``, ``nap`` and ``tick`` in both policy
    layers, its workspace holding ``note.txt``; at the end every terminal is stopped, and what
    remains anyway unmounted and killed."""
    with coder_host(_template, SCRATCH, TOOLS, {"note.txt": NOTE + "\n"}) as host:
        host.install("nap", nap_program(host.ws))
        host.install("tick", '#!/bin/sh\necho "tick $1"\n')
        for tool in TOOLS:
            host.grant_in_tool(tool)
        life = Life(host)
        try:
            yield life
        finally:
            for session in dict.fromkeys(host.started):
                life.stop(session)
            host.started.clear()
            life.scrub()


# ------------------------------------------------------------------------------------ tests


def test_create_again_same_or_changed_request_is_refused_and_changes_nothing(
    life: Life,
) -> None:
    """A-3: an existing agent is never overwritten: the same request again and a changed one
    are EEXIST with what to do instead, and leave its controls and its log as they were."""
    host = life.host
    before = snapshot(host.storage / "agent")
    same = {"name": "coder", "label": "coder_t", "tools": TOOLS}
    changed = {"name": "coder", "label": "boss_t", "tools": ["shell.exec"], "model": []}
    for request in (same, changed):
        again = host.ctx("agent", "create", "-", input=json.dumps(request))
        assert again.rc == 1 and again.out == "", again
        assert again.err.startswith("ctx: EEXIST: ") and "never overwritten" in again.err
        assert "agent/coder.d/" in again.err, again  # where to change it instead
    assert snapshot(host.storage / "agent") == before
    shown = host.ctx("agent", "show", "coder", "--json").json()
    assert shown["label"] == "coder_t" and shown["problems"] == [], shown
    listed = host.ctx("agent", "list", "--json").json()
    assert [a["name"] for a in listed] == ["coder"], listed


def test_creates_of_one_name_from_many_shells_make_exactly_one_whole_agent(life: Life) -> None:
    """A-3 under a race: six operators create ``twin`` at once with six labels; one wins, the
    five others are EEXIST, the winner's request is the one on disk, its log says one
    creation, and the list shows one agent with no problems."""
    host = life.host

    def create(n: int) -> Run:
        request = {"name": "twin", "label": f"twin{n}_t", "tools": ["fs.read"]}
        return host.ctx("agent", "create", "-", "--json", input=json.dumps(request))

    with ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(create, range(6)))
    won = [n for n, r in enumerate(runs) if r.rc == 0]
    assert len(won) == 1, runs
    for run in runs:
        if run.rc != 0:
            assert run.rc == 1 and json.loads(run.out)["error"] == "EEXIST", run
    label = (host.storage / "agent" / "twin.d" / "label").read_text().strip()
    assert label == f"twin{won[0]}_t"
    log = read_jsonl(host.storage / "agent" / "twin.d" / "log")
    assert [e["type"] for e in log] == ["agent.created"] and log[0]["label"] == label, log
    listed = {a["name"]: a for a in host.ctx("agent", "list", "--json").json()}
    assert set(listed) == {"coder", "twin"}
    assert listed["twin"]["label"] == label and listed["twin"]["problems"] == [], listed
    leftovers = [p.name for p in (host.storage / "agent").iterdir() if "twin" in p.name]
    assert sorted(leftovers) == ["twin", "twin.d"], leftovers


def test_start_twice_in_a_row_then_from_four_shells_at_once(life: Life) -> None:
    """One terminal per agent and session (EEXIST, naming watch/stop/--session): a second
    start in a row leaves the first untouched; four starts at once make exactly one terminal
    with one view; one stop then leaves nothing."""
    first = life.start("one")
    assert first.rc == 0, first
    pid = life.pid("one")
    again = life.start("one")
    assert again.rc == 1 and again.err.startswith("ctx: EEXIST: "), again
    for hint in ("ctx agent watch coder --session one", "ctx agent stop coder --session one"):
        assert hint in again.err, again
    assert life.pid("one") == pid and alive(pid)
    assert life.mounts(life.rundir("one")) == [str(life.view("one"))]

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(life.start, ["four"] * 4))
    assert sorted(r.rc for r in runs) == [0, 1, 1, 1], runs
    assert all(r.err.startswith("ctx: EEXIST: ") for r in runs if r.rc), runs
    assert life.mounts(life.rundir("four")) == [str(life.view("four"))]
    assert life.lifecycle_types("four") == ["terminal.started"]

    for session in ("one", "four"):
        stopped = life.stop(session)
        assert stopped.rc == 0 and stopped.out.startswith(f"stopped coder, session {session}")
        assert life.leftovers(session) == {}, session
    assert life.nothing_left() == {}


def test_stop_twice_says_enoent_and_logs_one_stop(life: Life) -> None:
    """docs/tools.md: a terminal that is not running is ENOENT (exit 1), with how to start
    one; the second stop changes nothing and the agent's log holds one start and one stop."""
    assert life.start("s").rc == 0
    pid = life.pid("s")
    first = life.stop("s")
    assert first.rc == 0 and first.out == f"stopped coder, session s (pid {pid})\n", first
    second = life.stop("s")
    assert second.rc == 1 and second.out == "", second
    assert second.err.startswith("ctx: ENOENT: ") and "ctx agent start coder" in second.err
    assert life.lifecycle_types("s") == ["terminal.started", "terminal.stopped"]
    assert life.leftovers("s") == {} and life.nothing_left() == {}


def test_concurrent_stops_end_one_terminal_once(life: Life) -> None:
    """Three operators stop the same terminal at once: none fails with a traceback or an
    unexplained status, the terminal ends once (one ``terminal.stopped``) and nothing is
    left."""
    assert life.start("s").rc == 0
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(life.stop, ["s"] * 3))
    for run in runs:
        ok = run.rc == 0 and run.out.startswith("stopped coder, session s")
        refused = run.rc == 1 and run.err.startswith("ctx: ENOENT: ")
        assert ok or refused, run
        assert "Traceback" not in run.err, run
    assert any(r.rc == 0 for r in runs), runs
    assert life.lifecycle_types("s") == ["terminal.started", "terminal.stopped"]
    assert life.leftovers("s") == {} and life.nothing_left() == {}


def test_stop_while_a_tool_call_runs_ends_it_and_records_it_once(life: Life) -> None:
    """A stop while ``nap`` waits in the terminal: the stop returns, the tool's process is
    gone, the attached client sees the end, and the call is one ``tool_call`` and one
    ``tool_result`` (an error: it did not finish)."""
    assert life.start("s").rc == 0
    with contextlib.closing(attach(life, "s")) as client:
        client.type("nap forever")
        assert client.shows("nap forever begins"), client.text()
        tool_pid = int(client.text().split("nap forever begins ")[1].split()[0])
        stopped = life.stop("s")
        assert stopped.rc == 0 and stopped.out.startswith("stopped coder, session s"), stopped
        assert client.eof.wait(10)
    assert wait_for(lambda: not alive(tool_pid), 10), tool_pid
    calls = life.calls("s", "nap")
    assert len(calls) == 1 and recorded_once(calls), calls
    [result] = life.results("s", "nap")
    assert result["status"] == "error", result
    assert life.leftovers("s") == {} and life.nothing_left() == {}


@pytest.mark.parametrize("unmounted_first", [False, True], ids=["killed", "unmounted-killed"])
def test_start_after_the_terminal_was_killed_cleans_up_and_starts_anew(
    life: Life, unmounted_first: bool
) -> None:
    """docs/tools.md "A terminal that was killed": ``kill -9`` of ctxterm leaves its view
    mounted, its mount process running and its sockets; the next start cleans that up,
    says what it removed (a warning; ``cleaned`` with --json), and starts one terminal with
    one view.  The same after the view was first lazily unmounted by hand."""
    assert life.start("s").rc == 0
    old_mount_process = life.processes(life.view("s"))
    if unmounted_first:
        subprocess.run(["umount", "-l", str(life.view("s"))], check=True)
    dead = life.kill_terminal("s")
    assert life.ctx("agent", "list").rc == 0
    again = life.start("s")
    assert again.rc == 0, again
    assert f"(pid {dead}) had ended without cleaning up" in again.err, again
    assert again.json()["cleaned"], again
    assert life.pid("s") != dead
    assert wait_for(lambda: not any(alive(p) for p in old_mount_process), 10)
    assert life.mounts(life.rundir("s")) == [str(life.view("s"))]
    with contextlib.closing(attach(life, "s")) as client:
        assert "tick after" in client.answer("tick after")
    assert life.stop("s").rc == 0
    assert life.leftovers("s") == {} and life.nothing_left() == {}
    assert recorded_once(life.calls("s", "tick"))


def test_view_lazily_unmounted_by_hand_keeps_the_terminal_until_stopped(life: Life) -> None:
    """``umount -l`` of a running terminal's view: the terminal still runs, so a start is
    EEXIST; a stop ends it and leaves nothing; a start after that works."""
    assert life.start("s").rc == 0
    pid = life.pid("s")
    subprocess.run(["umount", "-l", str(life.view("s"))], check=True)
    assert life.mounts(life.rundir("s")) == []
    again = life.start("s")
    assert again.rc == 1 and again.err.startswith("ctx: EEXIST: "), again
    assert alive(pid)
    stopped = life.stop("s")
    assert stopped.rc == 0 and stopped.out.startswith(f"stopped coder, session s (pid {pid})")
    assert life.leftovers("s") == {}
    assert life.start("s").rc == 0
    assert life.mounts(life.rundir("s")) == [str(life.view("s"))]
    assert life.stop("s").rc == 0
    assert life.leftovers("s") == {} and life.nothing_left() == {}


def test_stop_after_the_view_mount_process_was_killed(life: Life) -> None:
    """``kill -9`` of the view's mount process under a running terminal: the terminal notes
    the view lost in the agent's log (docs/sessions.md, ``terminal.view_lost``) and, at the
    stop, unmounts the dead view itself; the stop ends the terminal and leaves nothing
    mounted or running."""
    assert life.start("s").rc == 0
    [mount_process] = [
        p
        for p in life.processes(life.view("s"))
        if b" mount " in Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
    ]
    os.kill(mount_process, signal.SIGKILL)
    assert wait_for(lambda: not alive(mount_process), 10)
    log = life.host.storage / "agent" / "coder.d" / "log"
    assert wait_for(lambda: "terminal.view_lost" in log.read_text(), 10), log.read_text()
    stopped = life.stop("s")
    assert stopped.rc == 0 and stopped.out.startswith("stopped coder, session s"), stopped
    lost = [e for e in read_jsonl(log) if e["type"] == "terminal.view_lost"]
    assert [(e["session"], e["pid"], e["exit_status"]) for e in lost] == [
        ("s", mount_process, 137)
    ], lost
    assert life.leftovers("s") == {} and life.nothing_left() == {}


def test_stop_cleans_up_after_a_killed_terminal_whose_call_finishes_on_its_own(
    life: Life,
) -> None:
    """docs/tools.md: a tool call running when ctxterm was killed is not ended: it finishes
    on its own and its result goes to its session once; ``ctx agent stop`` then cleans up
    after the terminal, exit 0, saying so."""
    assert life.start("s").rc == 0
    with contextlib.closing(attach(life, "s")) as client:
        client.type("nap k")
        assert client.shows("nap k begins"), client.text()
        dead = life.kill_terminal("s")
    go(life, "k")
    assert wait_for(lambda: len(life.results("s", "nap")) == 1, 20)
    calls = life.calls("s", "nap")
    assert len(calls) == 1 and recorded_once(calls), calls
    cleaned = life.stop("s")
    assert cleaned.rc == 0, cleaned
    assert cleaned.out.startswith(f"cleaned up after coder, session s (pid {dead})"), cleaned
    assert life.leftovers("s") == {} and life.nothing_left() == {}


def test_agent_log_tells_that_a_killed_terminal_ended(life: Life) -> None:
    """S-3/S-4: the agent's log records facts: once ``ctx agent stop`` has cleaned up after
    a killed terminal, the log says that terminal ended, so that it does not read as one
    still running."""
    assert life.start("s").rc == 0
    life.kill_terminal("s")
    cleaned = life.stop("s")
    assert cleaned.rc == 0 and cleaned.out.startswith("cleaned up after coder"), cleaned
    types = life.lifecycle_types("s")
    assert types[0] == "terminal.started" and len(types) == 2, types


def test_clients_of_a_killed_terminal_are_not_held_by_its_running_call(life: Life) -> None:
    """docs/tools.md: a call running when ctxterm was killed finishes on its own; but the
    terminal is gone, so its attached client is told (end of file) and a new ``ctx agent
    watch`` is answered at once (no terminal answering: ENOENT), not held open by the call
    until it ends."""
    assert life.start("s").rc == 0
    try:
        with contextlib.closing(attach(life, "s")) as client:
            client.type("nap held")
            assert client.shows("nap held begins"), client.text()
            life.kill_terminal("s")
            assert client.eof.wait(5), "the attached client saw no end"
        watched = subprocess.run(
            [*CTX_ARGV, "agent", "watch", "coder", "--session", "s"],
            capture_output=True, text=True, env=life.host.env, timeout=10,
        )  # fmt: skip
        assert watched.returncode == 1 and watched.stderr.startswith("ctx: ENOENT"), watched
    finally:
        go(life, "held")


def test_watch_and_attach_end_cleanly_when_the_terminal_stops(life: Life) -> None:
    """A-2 clients while the terminal stops: ``ctx agent watch`` and ``attach`` both leave
    with exit 0 and say on standard error that the terminal closed the connection."""
    assert life.start("s").rc == 0
    clients = [Reader(life, "watch", "s"), Reader(life, "attach", "s")]
    try:
        for client in clients:
            assert client.shows(PROMPT), client.data
        assert life.stop("s").rc == 0
        for client in clients:
            rc, err = client.ended()
            assert rc == 0 and "closed the connection" in err, (rc, err)
            assert "Traceback" not in err
    finally:
        for client in clients:
            client.kill()
    assert life.leftovers("s") == {} and life.nothing_left() == {}


def test_ctx_run_in_the_session_of_a_running_terminal_call(life: Life) -> None:
    """``ctx run --agent coder --session S`` twice at once while the terminal of S runs a
    call: all three calls end well and each is recorded once, in the session and in the
    tool's log."""
    assert life.start("s").rc == 0
    go(life, "r1")
    go(life, "r2")
    with contextlib.closing(attach(life, "s")) as client:
        client.type("nap t1")
        assert client.shows("nap t1 begins"), client.text()
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda i: life.run("s", "nap", i), ["r1", "r2"]))
        for run, ident in zip(runs, ["r1", "r2"], strict=True):
            assert run.rc == 0 and f"nap {ident} ends" in run.out, run
        go(life, "t1")
        assert client.shows("nap t1 ends") and client.shows(PROMPT, 2), client.text()
    calls = life.calls("s", "nap")
    assert len(calls) == 3 and recorded_once(calls), calls
    assert all(r["status"] == "ok" for r in life.results("s", "nap"))
    tool_log = read_jsonl(life.host.storage / "tool" / "nap.d" / "log")
    logged = Counter(e["call"] for e in tool_log if e.get("type") == "tool_result")
    assert all(logged[call] == 1 for call in calls), (logged, calls)


def test_policy_edits_while_a_call_runs(life: Life) -> None:
    """P-5/P-6 while a call runs: the grant revoked from the agent's policy mid-call lets
    that call finish (it was authorised when it began) but refuses the next with EACCES at
    step 5, recorded; the grant restored is honoured again within the view's second of
    caching.  Every attempt is recorded once."""
    policy = agent_policy(life)
    granted = policy.read_text()
    assert "allow coder_t tool:nap execute" in granted
    assert life.start("s").rc == 0
    with contextlib.closing(attach(life, "s")) as client:
        client.type("nap p1")
        assert client.shows("nap p1 begins"), client.text()
        revoked = "".join(
            line for line in granted.splitlines(True) if "tool:nap" not in line
        )  # fmt: skip
        replace_text(policy, revoked)
        go(life, "p1")
        assert client.shows("nap p1 ends") and client.shows(PROMPT, 2), client.text()
        go(life, "p2")
        refused = client.answer("nap p2")
        assert "EACCES" in refused and "step 5" in refused, refused
        replace_text(policy, granted)
        go(life, "p3")
        assert wait_for(lambda: "nap p3 ends" in client.answer("nap p3"), 15)
    calls = life.calls("s", "nap")
    assert recorded_once(calls), calls
    statuses = [(r["status"], r.get("errno")) for r in life.results("s", "nap")]
    assert statuses[0] == ("ok", None) and statuses[1] == ("error", "EACCES"), statuses
    assert statuses[-1] == ("ok", None), statuses
    assert life.stop("s").rc == 0 and life.nothing_left() == {}


def test_identity_user_deleted_between_create_and_start(life: Life) -> None:
    """The agent's user is deleted (``userdel``) after ``ctx agent create --user``: list and
    show still tell the numeric identity on record, and a start either refuses with an
    errno and leaves nothing, or starts the terminal as that uid and a stop leaves
    nothing."""
    host = life.host
    name = f"ctxlc{uuid.uuid4().hex[:8]}"
    entry = useradd(name)
    try:
        request = {"name": "orphan", "label": "orphan_t", "tools": ["tick"]}
        made = host.ctx("agent", "create", "-", "--json", "--user", name, input=json.dumps(request))
        assert made.rc == 0, made
    finally:
        userdel(name)
    with pytest.raises(KeyError):
        pwd.getpwuid(entry.pw_uid)
    listed = {a["name"]: a for a in host.ctx("agent", "list", "--json").json()}
    assert listed["orphan"]["identity"]["uid"] == entry.pw_uid, listed
    shown = host.ctx("agent", "show", "orphan", "--json")
    assert shown.rc == 0 and shown.json()["identity"]["uid"] == entry.pw_uid, shown
    os.chown(host.ws, entry.pw_uid, entry.pw_gid)
    started = host.ctx("agent", "start", "orphan", "--session", "o", "--json", cwd=host.ws)
    if started.rc != 0:
        assert started.err.startswith("ctx: E") and "Traceback" not in started.err, started
    else:
        rundir = Path(started.json()["listening_at"]).parent
        life.ctxterms.add(int((rundir / "pid").read_text()))
        life.key_dir = rundir.parents[2]
        stopped = host.ctx("agent", "stop", "orphan", "--session", "o")
        assert stopped.rc == 0 and stopped.out.startswith("stopped orphan, session o"), stopped
        assert not rundir.exists() and life.mounts(rundir) == []
    assert life.nothing_left() == {}


def test_bootstrap_reinstalls_the_tool_tier_under_a_running_terminal(life: Life) -> None:
    """``ctx bootstrap`` while a terminal runs a call, after ``tool/fs.read`` and
    ``bin/tsh`` were removed: it recreates them and keeps the tool's policy; the running
    call finishes and is recorded once; the terminal then runs ``fs.read`` again."""
    host = life.host
    assert life.start("s").rc == 0
    with contextlib.closing(attach(life, "s")) as client:
        assert NOTE in client.answer('fs.read \'{"path": "note.txt"}\'')
        client.type("nap b1")
        assert client.shows("nap b1 begins"), client.text()
        (host.storage / "tool" / "fs.read").unlink()
        (host.storage / "bin" / "tsh").unlink()
        boot = host.ctx("bootstrap", "--storage", host.storage)
        assert boot.rc == 0, boot
        assert "tool/fs.read" in boot.out and "bin/tsh" in boot.out, boot
        assert (
            "allow coder_t tool:fs.read execute"
            in (host.storage / "tool" / "fs.read.d" / "policy").read_text()
        )
        go(life, "b1")
        assert client.shows("nap b1 ends") and client.shows(PROMPT, 3), client.text()
        assert wait_for(lambda: NOTE in client.answer('fs.read \'{"path": "note.txt"}\''), 15), (
            client.text()[-600:]
        )
    assert recorded_once(life.calls("s", "nap")) and len(life.calls("s", "nap")) == 1
    assert recorded_once(life.calls("s", "tool/fs.read"))
    assert life.stop("s").rc == 0 and life.nothing_left() == {}


# ---------------------------------------------------------------------------- state machine

DOWN, UP, UNMOUNTED, DEAD = "down", "up", "unmounted", "dead"


def test_lifecycle_state_machine(life: Life) -> None:
    """Start, stop, kill -9, lazy unmount and ``ctx run`` calls over two sessions in orders a
    fixed, derandomised search picks: each command's answer matches a model of the
    terminal's state, a running terminal has exactly one view mounted and a stopped one
    none, every call is recorded once, and the end leaves nothing."""
    runs = iter(range(1000))

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            n = next(runs)
            self.sessions = {f"a{n}": DOWN, f"b{n}": DOWN}
            self.ticks = dict.fromkeys(self.sessions, 0)
            # A first terminal shows where this root's terminals live.
            first = next(iter(self.sessions))
            assert life.start(first).rc == 0
            self.sessions[first] = UP

        names = st.sampled_from(["a", "b"])

        def session(self, letter: str) -> str:
            return next(s for s in self.sessions if s.startswith(letter))

        @rule(letter=names)
        def start(self, letter: str) -> None:
            s = self.session(letter)
            state = self.sessions[s]
            started = life.start(s)
            if state in (UP, UNMOUNTED):
                assert started.rc == 1 and started.err.startswith("ctx: EEXIST: "), started
                return
            assert started.rc == 0, started
            if state == DEAD:
                assert "had ended without cleaning up" in started.err, started
            else:
                assert started.err == "", started
            self.sessions[s] = UP

        @rule(letter=names)
        def stop(self, letter: str) -> None:
            s = self.session(letter)
            state = self.sessions[s]
            stopped = life.stop(s)
            if state == DOWN:
                assert stopped.rc == 1 and stopped.err.startswith("ctx: ENOENT: "), stopped
            elif state == DEAD:
                assert stopped.rc == 0, stopped
                assert stopped.out.startswith(f"cleaned up after coder, session {s}"), stopped
            else:
                assert stopped.rc == 0, stopped
                assert stopped.out.startswith(f"stopped coder, session {s}"), stopped
            self.sessions[s] = DOWN
            assert life.leftovers(s) == {}, s

        @precondition(
            lambda self: UP in self.sessions.values() or UNMOUNTED in self.sessions.values()
        )
        @rule(letter=names)
        def kill(self, letter: str) -> None:
            s = self.session(letter)
            if self.sessions[s] in (UP, UNMOUNTED):
                life.kill_terminal(s)
                self.sessions[s] = DEAD

        @precondition(lambda self: UP in self.sessions.values())
        @rule(letter=names)
        def lazy_unmount(self, letter: str) -> None:
            s = self.session(letter)
            if self.sessions[s] == UP:
                subprocess.run(["umount", "-l", str(life.view(s))], check=True)
                self.sessions[s] = UNMOUNTED

        @rule(letter=names)
        def call(self, letter: str) -> None:
            s = self.session(letter)
            ran = life.run(s, "tick", str(self.ticks[s]))
            assert ran.rc == 0 and ran.out == f"tick {self.ticks[s]}\n", ran
            self.ticks[s] += 1

        @invariant()
        def views_match_the_model(self) -> None:
            for s, state in self.sessions.items():
                views = life.mounts(life.rundir(s))
                if state == UP:
                    assert views == [str(life.view(s))], (s, state, views)
                elif state in (DOWN, UNMOUNTED):
                    assert views == [], (s, state, views)

        @invariant()
        def calls_recorded_once(self) -> None:
            for s, ticks in self.ticks.items():
                calls = life.calls(s, "tick")
                assert len(calls) == ticks and recorded_once(calls), (s, calls)

        def teardown(self) -> None:
            for s, state in self.sessions.items():
                if state != DOWN:
                    assert life.stop(s).rc == 0, s
                assert life.leftovers(s) == {}, s
            listed = life.host.ctx("agent", "list", "--json").json()
            assert [(a["name"], a["problems"]) for a in listed] == [("coder", [])], listed

    run_state_machine_as_test(
        Lifecycle,
        settings=settings(
            max_examples=2,
            stateful_step_count=8,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert life.nothing_left() == {}
