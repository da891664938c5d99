"""An agent's terminal while the host changes what it is made of (SPEC §8 A-1, A-2; §7 H-1,
H-4; §5 P-6; §6 T-1, T-5): ``ctx agent start`` from a workspace, clients on its socket
(``ctx agent watch``/``attach`` and raw ``watch``/``attach`` clients), then, under the running
terminal, the agent's policy loses a tool, its mount control gains and loses a mount, its
identity gets another uid, its controls are removed, ``ctx bootstrap`` runs again (a new
``bin/ctxterm`` and ``bin/tsh`` written while a foreground ``bin/ctxterm`` serves),
``tool/tsh.d/config`` is filled with lines tsh cannot use, a tool is reinstalled and disabled
while a call of it runs, the terminal's socket is unlinked from its directory, and clients
join, leave and send garbage by the dozen.

What is checked: the terminal keeps running (or stops with a clear line), the next call meets
the host's new word, clients get errno-style errors that say what to do, ``ctx agent stop``
and ``watch`` tell the truth about what runs, and nothing is left behind (processes, sockets,
mounts, runtime directories).  Black-box: the installed ``ctx``, real processes, PTYs,
sockets, FUSE views and bubblewrap sandboxes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    alive,
    closing_all,
    mounted_at,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, Term, coder_host

SCRATCH = scratch_top(__file__)
NOTE = "notes kept in the operator's workspace\n"
TOOLS = ["fs.read", "fs.list", "demo.nap"]


def nap(ws: Path, version: str = "") -> str:
    """Tool ``demo.nap ID``: says it began, waits until ``ws/go-ID`` exists, says it ended
    (and which version it is): a call that runs for as long as the test wants."""
    return (
        "#!/bin/sh\n"
        'echo "nap $1 begins"\n'
        f'while [ ! -e "{ws}/go-$1" ]; do sleep 0.05; done\n'
        f'echo "nap $1 ends{version}"\n'
    )


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- the host


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` allowed :data:`TOOLS` in both policies, ``demo.nap`` installed and
    ``notes.txt`` in its workspace."""
    with coder_host(_template, SCRATCH, TOOLS, {"notes.txt": NOTE}) as host:
        host.install("demo.nap", nap(host.ws), description="Wait for a file.")
        for tool in TOOLS:
            host.grant_in_tool(tool)
        yield host


def attach(term: Term, opened: list) -> Raw:
    typist = Raw(term.listening_at, b"attach\n")
    opened.append(typist)
    assert typist.shows(AGENT_PROMPT), typist.text()
    return typist


def ctxterm_pid(term: Term) -> int:
    return int((term.rundir / "pid").read_text())


def left_of(term: Term, pid: int) -> dict[str, object]:
    """What a terminal that should have ended left: its process, its runtime directory, its
    view's mount, the session's link."""
    left: dict[str, object] = {}
    if alive(pid):
        left["ctxterm"] = pid
    if term.rundir.exists():
        left["rundir"] = sorted(p.name for p in term.rundir.iterdir())
    if mounted_at(term.rundir / "private" / "ctx"):
        left["view"] = "mounted"
    if os.path.lexists(term.link):
        left["link"] = os.readlink(term.link)
    return left


def stop(host: CoderHost, term: Term) -> None:
    """``ctx agent stop`` of ``term``, which must say it stopped the running terminal and
    leave nothing of it."""
    pid = ctxterm_pid(term)
    stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
    assert stopped.rc == 0, stopped
    assert stopped.out.strip() == f"stopped coder, session {term.session} (pid {pid})", stopped
    host.started.remove(term.session)
    assert wait_for(lambda: left_of(term, pid) == {}, 15), left_of(term, pid)


def without_line(path: Path, text: str) -> None:
    path.write_text("".join(line for line in path.read_text().splitlines(True) if text not in line))


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ------------------------------------------------------------------------------------ the flows


def test_the_policy_loses_a_tool_the_next_call_is_refused_and_tsh_goes_on(host: CoderHost) -> None:
    """P-6, T-5: the grant taken out of ``agent/coder.d/policy`` under a running terminal
    holds for the next call, refused with EACCES naming the policy; tsh and its watchers go
    on, and the grant given back works again without a restart."""
    term = host.start()
    policy = host.storage / "agent" / "coder.d" / "policy"
    with closing_all() as opened:
        watcher = Raw(term.listening_at, b"watch\n")
        opened.append(watcher)
        typist = attach(term, opened)
        assert typist.answer("fs.read notes.txt") == NOTE
        without_line(policy, "tool:fs.read execute")
        refused = typist.answer("fs.read notes.txt")
        assert refused == (
            "tsh: fs.read: EACCES: step 5 (object policy): agent/coder.d/policy has no rule "
            "'allow coder_t tool:fs.read execute'\n"
        ), refused
        assert typist.answer("fs.list .") != ""  # the rest of its grants stand
        with policy.open("a") as rules:
            rules.write("allow coder_t tool:fs.read execute\n")
        # docs/mount.md: a policy change shows in the agent's view within a second; a slow
        # machine may have let the view drop the tool while it was refused.
        time.sleep(1.1)
        assert typist.answer("fs.read notes.txt") == NOTE
        assert wait_for(lambda: watcher.text().count(NOTE) == 2), watcher.text()
        assert "has no rule 'allow coder_t tool:fs.read execute'" in watcher.text()
        assert not watcher.eof.is_set() and not typist.eof.is_set()
    results = [e for e in host.calls(term.session, "fs.read") if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["ok", "error", "ok"], results
    stop(host, term)


def test_a_mount_added_then_taken_out_of_the_mount_control_holds_for_the_next_call(
    host: CoderHost,
) -> None:
    """T-5, A-3: a mount the host adds to ``agent/coder.d/mount`` (with ``mount:data read``
    granted) under a running terminal, then takes out again: each call's tool gets the
    mounts the controls give when it starts, ``ctx agent show`` says the same, and the
    terminal goes on through both changes."""
    data = host.top / "data"
    data.mkdir(mode=0o755)
    (data / "data.txt").write_text("kept in the data mount\n")
    (data / "data.txt").chmod(0o644)
    mounts = host.storage / "agent" / "coder.d" / "mount"
    policy = host.storage / "agent" / "coder.d" / "policy"
    before = mounts.read_text()
    outside = "fs.read: EACCES: /data/data.txt is outside every mount visible to the agent\n"
    term = host.start()
    with closing_all() as opened:
        typist = attach(term, opened)
        assert typist.answer("fs.read /data/data.txt") == outside
        mounts.write_text(json.dumps([*json.loads(before), [str(data), "/data", "ro"]]))
        with policy.open("a") as rules:
            rules.write("allow coder_t mount:data read\n")
        shown = host.ctx("agent", "show", "coder", "--json")
        assert [str(data), "/data", "ro"] in shown.json()["mounts"], shown
        assert typist.answer("fs.read /data/data.txt") == "kept in the data mount\n"
        mounts.write_text(before)
        assert typist.answer("fs.read /data/data.txt") == outside
        shown = host.ctx("agent", "show", "coder", "--json")
        assert [str(data), "/data", "ro"] not in shown.json()["mounts"], shown
        assert typist.answer("fs.read notes.txt") == NOTE
        assert not typist.eof.is_set()
    results = [e for e in host.calls(term.session, "fs.read") if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["error", "ok", "error", "ok"], results
    stop(host, term)


def test_the_agents_uid_changed_under_its_terminal_stop_still_finds_it(host: CoderHost) -> None:
    """A-1, A-2: the host gives agent ``coder`` another uid in ``agent/coder.d/identity``
    while its terminal runs: ``ctx agent stop`` still ends that terminal, rather than claim
    that none runs (a second ``ctx agent start`` of the session would then run a second
    terminal beside the first, as the new uid), and leaves nothing of it."""
    term = host.start()
    identity = host.storage / "agent" / "coder.d" / "identity"
    before = identity.read_text()
    pid = ctxterm_pid(term)
    try:
        identity.write_text(json.dumps({**json.loads(before), "uid": host.uid - 1}))
        second = host.ctx("agent", "start", "coder", "--session", term.session)
        assert second.rc == 1 and "EEXIST" in second.err, second
        assert f"started as uid {host.uid}" in second.err and "'ctx agent stop" in second.err
        assert alive(pid)
        stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
        assert stopped.rc == 0, stopped
        assert wait_for(lambda: left_of(term, pid) == {}, 15), left_of(term, pid)
    finally:
        identity.write_text(before)  # the fixture's stop then ends the terminal


def test_the_agents_controls_removed_under_its_terminal(host: CoderHost) -> None:
    """A-1, A-3: ``agent/coder`` and ``agent/coder.d`` removed by hand while the terminal
    runs: the next call is refused with a reason and the terminal goes on; ``ctx agent stop
    coder`` must still end it (or name the terminal it leaves running), not only say that
    there is no such agent and suggest creating one."""
    term = host.start()
    agent_dir = host.storage / "agent"
    kept = host.top / "kept"
    kept.mkdir()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        typist = attach(term, opened)
        try:
            for name in ("coder", "coder.d"):
                os.rename(agent_dir / name, kept / name)
            refused = typist.answer("fs.read notes.txt")
            assert refused.startswith("tsh: fs.read: ENOENT: there is no agent 'coder'"), refused
            assert not typist.eof.is_set() and alive(pid)
            stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
            assert stopped.rc == 0, stopped
            assert wait_for(lambda: left_of(term, pid) == {}, 15), left_of(term, pid)
        finally:
            for name in ("coder", "coder.d"):
                if not os.path.lexists(agent_dir / name):
                    os.rename(kept / name, agent_dir / name)


def test_the_terminals_socket_unlinked_watch_start_and_stop_agree(host: CoderHost) -> None:
    """A-2: the terminal's ``main.sock`` unlinked from its runtime directory while it runs
    (a cleaner of /run, a hand): ``ctx agent start`` refuses, as the terminal runs; ``ctx
    agent watch`` cannot reach it, and must not say that no terminal runs and to start one;
    ``ctx agent stop`` ends it and removes everything."""
    term = host.start()
    term.listening_at.unlink()
    started = host.ctx("agent", "start", "coder", "--session", term.session, cwd=host.ws)
    assert started.rc == 1 and "EEXIST: the terminal of coder" in started.err, started
    watched = host.ctx("agent", "watch", "coder", "--session", term.session)
    assert watched.rc != 0, watched
    stop(host, term)
    assert "is running; start one" not in watched.err, watched
    assert watched.err.startswith("ctx: ECONNREFUSED: the terminal of coder in session "), watched
    assert f"'ctx agent stop coder --session {term.session}', then start" in watched.err


def test_the_terminals_socket_unlinked_stop_still_ends_it(host: CoderHost) -> None:
    """A-2: with its ``main.sock`` unlinked, the terminal is still found by its lock and pid
    file: ``ctx agent stop`` ends it and leaves nothing, and a new start of the session
    serves clients again."""
    term = host.start()
    term.listening_at.unlink()
    stop(host, term)
    again = host.start(term.session)
    with closing_all() as opened:
        assert attach(again, opened).answer("fs.read notes.txt") == NOTE
    stop(host, again)


def test_a_tool_disabled_and_reinstalled_while_a_call_of_it_runs(host: CoderHost) -> None:
    """T-1, T-8: while ``demo.nap`` runs in the terminal the administrator writes ``disabled``
    to its status and reinstalls it: the running call ends as it began, recorded once; the
    next is refused with EACCES saying how it runs again (the reinstall kept ``disabled``,
    ``ctx object list`` says so); ``available`` again, a call soon runs the new version
    (docs/mount.md: the view shows a change within a second); tsh goes on throughout."""
    term = host.start()
    status = host.storage / "tool" / "demo.nap.d" / "status"
    with closing_all() as opened:
        typist = attach(term, opened)
        prompts = typist.count(AGENT_PROMPT)
        typist.type("demo.nap a")
        assert typist.shows("nap a begins"), typist.text()
        status.write_text("disabled\n")
        host.install("demo.nap", nap(host.ws, " (v2)"), description="Wait for a file, again.")
        assert status.read_text() == "disabled\n"
        (host.ws / "go-a").touch()
        assert typist.shows(AGENT_PROMPT, prompts + 1), typist.text()
        assert (
            typist.text().split(AGENT_PROMPT)[prompts] == "demo.nap a\nnap a begins\nnap a ends\n"
        )
        (host.ws / "go-b").touch()
        refused = typist.answer("demo.nap b")
        assert refused in (
            "tsh: demo.nap: EACCES: tool demo.nap is not available (status: disabled); it runs "
            "again once its status control demo.nap.d/status reads 'available'\n",
            "tsh: demo.nap: not a tool on CTX_PATH (tsh runs CortexFS tools only)\n",
        ), refused
        [listed] = [
            o for o in host.ctx("object", "list", "--json").json() if o["name"] == "demo.nap"
        ]
        assert listed["status"] == "disabled", listed
        status.write_text("available\n")
        assert wait_for(
            lambda: typist.answer("demo.nap b") == "nap b begins\nnap b ends (v2)\n", 10, step=0.3
        ), typist.text()[-600:]
    calls = host.calls(term.session, "demo.nap")
    results = [e for e in calls if e["type"] == "tool_result"]
    assert results[0]["status"] == "ok" and results[-1]["status"] == "ok", results
    assert len([e for e in calls if e["type"] == "tool_call"]) == len(results), calls
    stop(host, term)


def test_tsh_config_filled_with_garbage_then_a_fifo_under_running_terminals(
    host: CoderHost,
) -> None:
    """H-4: ``tool/tsh.d/config`` rewritten under a running terminal with lines tsh cannot
    use (an escape sequence among them), then replaced by a FIFO: the running terminal goes
    on calling tools; a terminal started then says each bad line, escaped, and starts with
    the defaults; with the FIFO it says it cannot read it and starts all the same (never
    waiting on the FIFO); all three stop cleanly."""
    config = host.storage / "tool" / "tsh.d" / "config"
    first = host.start()
    with closing_all() as opened:
        typist = attach(first, opened)
        config.write_text("max_loaded_tools=lots\n\x1b[31mred=1\ncache_capacity=-1\n")
        assert typist.answer("fs.read notes.txt") == NOTE
        second = host.start()
        watcher = Raw(second.listening_at, b"watch\n")
        opened.append(watcher)
        assert watcher.shows(AGENT_PROMPT), watcher.text()
        said = watcher.text().split(AGENT_PROMPT)[0]
        assert b"\x1b" not in watcher.data, watcher.data
        for line in (
            "tsh: tsh.d/config:1: max_loaded_tools must be a positive integer, not 'lots' "
            "(ignored; the default applies)\n",
            "tsh: tsh.d/config:2: expected one of max_loaded_tools, cache_capacity, "
            "window_percent as key=value (ignored; the default applies)\n",
            "tsh: tsh.d/config:3: cache_capacity must be a positive integer, not '-1' "
            "(ignored; the default applies)\n",
        ):
            assert line in said, said
        config.unlink()
        os.mkfifo(config)
        config.chmod(0o644)
        third = host.start()
        watcher = Raw(third.listening_at, b"watch\n")
        opened.append(watcher)
        assert watcher.shows(AGENT_PROMPT), watcher.text()
        assert watcher.text().split(AGENT_PROMPT)[0] == (
            "tsh: /ctx/tool/tsh.d/config cannot be read (not a regular file): every setting "
            "(ignored; the default applies)\n"
        ), watcher.text()
        assert typist.answer("fs.read notes.txt") == NOTE
        assert typist.answer("tools").splitlines() == sorted(TOOLS)
    for term in (first, second, third):
        stop(host, term)


def test_bootstrap_writes_a_new_ctxterm_and_tsh_under_a_foreground_ctxterm(
    host: CoderHost,
) -> None:
    """H-1, A-1, R-5: ``bin/ctxterm`` serves a terminal in the foreground; then the host's
    ctx is upgraded: ``bin/ctxterm`` holds another program, ``bin/tsh`` is gone, and ``ctx
    bootstrap`` writes both anew.  The running terminal goes on (its tsh, its calls), a start
    of another session runs the new tsh, and ``ctx agent stop`` ends the foreground ctxterm
    with status 137 (a stop's SIGKILL of tsh), leaving nothing."""
    session = "foreground"
    proc = subprocess.Popen(
        [str(host.storage / "bin" / "ctxterm"), "coder", "--session", session, "--json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=host.ws, env=host.env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        facts = json.loads(proc.stdout.readline())
        host.started.append(session)
        term = Term(session, Path(facts["socket"]), Path(facts["listening_at"]))
        assert wait_for(lambda: (term.rundir / "pid").exists()), facts
        assert ctxterm_pid(term) == proc.pid == facts["pid"]
        with closing_all() as opened:
            typist = attach(term, opened)
            assert typist.answer("fs.read notes.txt") == NOTE
            (host.storage / "bin" / "ctxterm").write_text("#!/bin/sh\necho an older ctxterm\n")
            (host.storage / "bin" / "tsh").unlink()
            boot = host.ctx("bootstrap", "--storage", host.storage)
            assert boot.rc == 0, boot
            assert "created   bin/tsh\n" in boot.out and "repaired  bin/ctxterm\n" in boot.out
            assert typist.answer("fs.read notes.txt") == NOTE
            other = host.start()
            assert attach(other, opened).answer("fs.read notes.txt") == NOTE
            assert not typist.eof.is_set()
        stop(host, other)
        stop(host, term)
        assert proc.wait(timeout=20) == 137
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


REFUSED = b"ctxterm: expected 'watch' or 'attach' on the first line\n"


def test_clients_joining_leaving_and_sending_garbage_by_the_dozen_leak_nothing(
    host: CoderHost,
) -> None:
    """A-2: while an attached client works, forty more come: garbage for a mode line (binary,
    capitals, 100 bytes and no newline) is told, in one line, what the terminal expects, and
    let go; clients that close at once or watch and leave are forgotten.  The attached client
    goes on, ctxterm holds as many descriptors as before, and a stop leaves nothing."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        typist = attach(term, opened)
        assert typist.answer("fs.read notes.txt") == NOTE
        baseline = descriptors(pid)
        garbage = [b"\x00\xff\x1b[2J\n", b"WATCH\n", b"x" * 100, b"attach please\n"]
        refused: list[Raw] = []
        for i in range(40):
            kind = i % 6
            if kind < len(garbage):
                client = Raw(term.listening_at, garbage[kind])
                opened.append(client)
                refused.append(client)
            elif kind == 4:
                Raw(term.listening_at, read=False).close()
            else:
                watcher = Raw(term.listening_at, b"watch\n")
                assert watcher.shows(AGENT_PROMPT), watcher.text()
                watcher.close()
        for client in refused:
            assert client.eof.wait(15), client.data
            assert client.data == REFUSED, client.data
        assert typist.answer("fs.list .") == "notes.txt\n"
        assert wait_for(lambda: descriptors(pid) == baseline, 15), (descriptors(pid), baseline)
        assert not typist.eof.is_set()
    stop(host, term)
