"""End-to-end flows of an agent working inside its terminal (SPEC §7 H-1..H-4, §8 A-1, A-2,
§4 S-2, T-3, T-4, T-7; docs/tools.md "The agent terminal"): ``ctx agent start``, then through
the terminal socket the agent uses tsh's built-ins (``tools``, ``which``, ``describe``,
``load``, ``pin``, ``loaded``, ``unload``, ``unpin``, ``rehash``) under the settings of
``tool/tsh.d/config``, calls tools by name with arguments and typed stdin, lives through tools
installed, reinstalled, granted and revoked while it runs, meets the documented refusals of a
tool it may not run and of a damaged one, and finds every call in its session, while
``ctx agent watch`` shows an operator the same screen.

test_acceptance_tsh.py checks the H-4 bounds in a standalone tsh, and
test_acceptance_flows_terminals.py / test_acceptance_flows_terminal_socket.py the clients of
the socket; here the built-ins and tool calls are chained inside a live sandboxed terminal.
Black-box: the installed ``ctx``, real processes, PTYs, sockets, FUSE views and bubblewrap."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    closing_all,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, coder_host

SCRATCH = scratch_top(__file__)
NOTE = "notes kept in the operator's workspace\n"
# A tool that shows its argv one word per line and, unless its first word is "-", echoes
# its stdin (read to EOF) back.
ECHO = """#!/bin/sh
echo "argc=$#"
for word in "$@"; do echo "[$word]"; done
[ "$1" = - ] || echo "stdin=$(cat)"
"""
TOOLS = ["fs.read", "fs.list", "fs.stat", "tsh.config", "demo.echo"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- the host


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` allowed :data:`TOOLS` in both policies (and ``demo.late`` in its own
    policy only), ``demo.echo`` installed, and ``notes.txt`` in the workspace."""
    with coder_host(_template, SCRATCH, [*TOOLS, "demo.late"], {"notes.txt": NOTE}) as host:
        host.install("demo.echo", ECHO, description="Echo argv and stdin.\nMore text.")
        for tool in TOOLS:
            host.grant_in_tool(tool)
        yield host


# ------------------------------------------------------------------------------- the clients


class Watch:
    """``ctx agent watch coder --session S`` on pipes, its output collected in a thread."""

    def __init__(self, host: CoderHost, session: str) -> None:
        argv = [*CTX_ARGV, "agent", "watch", "coder", "--session", session]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=host.env, cwd=host.top, start_new_session=True,
        )  # fmt: skip
        self.data = b""
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.data += chunk

    def shows(self, text: str, seconds: float = 15) -> bool:
        return wait_for(lambda: text.encode() in self.data, seconds)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace").replace("\r\n", "\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self.reader.join(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]


def attach(listening_at: Path, opened: list) -> Raw:
    typist = Raw(listening_at, b"attach\n")
    opened.append(typist)
    assert typist.shows(AGENT_PROMPT), typist.text()
    return typist


def names(listing: str) -> list[str]:
    """What ``loaded`` printed: each tool's name, ``+`` after a pinned one."""
    return [
        line.split(":", 1)[0] + ("+" if line.endswith("(pinned)") else "")
        for line in listing.splitlines()
    ]


def exit_tsh(host: CoderHost, typist: Raw, session: str) -> int:
    """``exit`` typed in tsh (no N: the last status); the status ``terminal.stopped`` logs."""
    typist.type("exit")
    assert typist.eof.wait(20), typist.text()[-500:]

    def stopped() -> list[dict]:
        return [e for e in host.lifecycle(session) if e["type"] == "terminal.stopped"]

    assert wait_for(lambda: stopped(), 15), host.lifecycle(session)
    host.started.remove(session)
    return stopped()[0]["exit_status"]


# ------------------------------------------------------------------------------------ the flows


def test_the_h4_config_bounds_the_context_pins_outlast_it_and_a_watcher_sees_every_step(
    host: CoderHost,
) -> None:
    """H-4: ``tool/tsh.d/config`` (comments, a line tsh cannot use) is read by the terminal's
    tsh at start: ``max_loaded_tools=2`` unloads the least recently used unpinned tool, a
    pinned one is exempt until unpinned, and a tiny path cache (``cache_capacity=1``,
    ``window_percent=100``) still resolves every name as CTX_PATH does (T-4); built-ins used
    wrongly are usage errors naming their form.  ``ctx agent watch`` (A-2) shows all of it."""
    config = host.storage / "tool" / "tsh.d" / "config"
    config.write_text(
        "# a small context for a small agent\n\nmax_loaded_tools=2\n"
        "cache_capacity=1\nwindow_percent=100\nbogus=3\n"
    )
    term = host.start()
    session, listening_at = term.session, term.listening_at
    with closing_all() as opened:
        watcher = Watch(host, session)
        opened.append(watcher)
        typist = attach(listening_at, opened)
        # the unusable line is said when tsh starts, before its first prompt
        first = typist.text().split(AGENT_PROMPT)[0]
        assert "tsh: tsh.d/config:6: expected one of" in first, first
        assert "(ignored; the default applies)" in first, first

        shown = typist.answer("tools")
        assert shown.splitlines() == sorted(TOOLS), shown  # demo.late: not in its tool policy
        assert (
            typist.answer("pin fs.read")
            == "fs.read: "
            + ((host.storage / "tool" / "fs.read.d" / "description").read_text().splitlines()[0])
            + "  (pinned)\n"
        )
        shown = typist.answer("load fs.list fs.stat demo.echo")
        assert "tsh: unloaded fs.list (max_loaded_tools reached)\n" in shown, shown
        assert "demo.echo: Echo argv and stdin.\n" in shown, shown
        assert names(typist.answer("loaded")) == ["fs.read+", "demo.echo", "fs.stat"]

        shown = typist.answer("unload fs.read")
        assert shown == "tsh: unload: fs.read: pinned; 'unpin fs.read' first\n", shown
        shown = typist.answer("unload fs.list")
        assert shown == "tsh: unload: fs.list: not loaded\n", shown
        # unpinned, fs.read is the most recent of three: the oldest goes
        shown = typist.answer("unpin fs.read")
        assert shown == "tsh: unloaded fs.stat (max_loaded_tools reached)\n", shown
        assert names(typist.answer("loaded")) == ["fs.read", "demo.echo"]
        typist.answer("unload demo.echo")
        ran = typist.answer("fs.read notes.txt")  # running a tool loads it too
        assert ran == NOTE, ran
        assert names(typist.answer("loaded")) == ["fs.read"]

        # a cache of one path, thrashed, never answers a stale or wrong path
        for _ in range(2):
            shown = typist.answer("which fs.read demo.echo fs.stat nothing.here")
            assert shown == (
                "/ctx/tool/fs.read\n/ctx/tool/demo.echo\n/ctx/tool/fs.stat\n"
                "tsh: nothing.here: not on CTX_PATH\n"
            ), shown
            assert typist.answer("rehash") == ""

        for line, usage in (
            ("which", "tsh: which: a tool name is needed (which NAME...)\n"),
            ("describe", "tsh: describe: a tool name is needed (describe NAME...)\n"),
            ("loaded fs.read", "tsh: loaded: takes no arguments (loaded)\n"),
            ("rehash now", "tsh: rehash: takes no arguments (rehash)\n"),
            ("ls -l", "tsh: ls: not a tool on CTX_PATH (tsh runs CortexFS tools only)\n"),
        ):
            assert typist.answer(line) == usage, line

        assert watcher.shows("tsh: rehash: takes no arguments"), watcher.text()[-800:]
        seen = watcher.text()
        for text in ("(ignored; the default applies)", "unloaded fs.stat", NOTE, "  (pinned)\n"):
            assert text in seen, (text, seen[-1500:])
        assert exit_tsh(host, typist, session) == 127  # the last line's status: no tool 'ls'
    # only the tool run is a call; built-ins record nothing
    assert {e["object"] for e in host.calls(session, "tool/fs.read")} == {"tool/fs.read"}
    assert [e["object"] for e in host.events(session) if e["type"] == "tool_call"] == [
        "tool/fs.read"
    ]


def test_argv_and_typed_stdin_reach_the_tool_and_each_call_is_a_call_result_pair(
    host: CoderHost,
) -> None:
    """T-3, H-2: a tool called by name in the terminal gets its argv as typed (quoted words,
    an empty one) and what the agent types until Ctrl-D as its stdin; T-7, S-2: each call is a
    ``tool_call`` then a ``tool_result`` of one call id in the session, with the argv and the
    exit status; a watcher sees the tool's output."""
    term = host.start()
    session, listening_at = term.session, term.listening_at
    with closing_all() as opened:
        watcher = Watch(host, session)
        opened.append(watcher)
        typist = attach(listening_at, opened)
        prompts = typist.count(AGENT_PROMPT)
        typist.type("demo.echo 'two words' '' \"x y\"")
        assert typist.shows("argc=3"), typist.text()
        typist.type("typed by the agent")
        typist.send(b"\x04")  # Ctrl-D: end of the tool's stdin
        assert typist.shows(AGENT_PROMPT, prompts + 1), typist.text()
        shown = typist.text().split(AGENT_PROMPT)[prompts]
        assert "argc=3\n[two words]\n[]\n[x y]\n" in shown, shown
        assert "stdin=typed by the agent\n" in shown, shown
        shown = typist.answer("demo.echo - ''")
        assert shown == "argc=2\n[-]\n[]\n", shown
        shown = typist.answer('fs.read \'{"path": "notes.txt"}\'')  # JSON input as one word
        assert shown == NOTE, shown
        shown = typist.answer("fs.read missing.txt")
        assert shown.startswith("fs.read: ENOENT: "), shown
        assert watcher.shows("stdin=typed by the agent"), watcher.text()
        assert watcher.shows("fs.read: ENOENT"), watcher.text()
        assert exit_tsh(host, typist, session) == 1  # fs.read's own failure status

    echo = host.calls(session, "tool/demo.echo")
    assert [e["type"] for e in echo] == ["tool_call", "tool_result"] * 2, echo
    assert [e["argv"] for e in echo if e["type"] == "tool_call"] == [
        ["two words", "", "x y"],
        ["-", ""],
    ]
    for call, result in zip(echo[::2], echo[1::2], strict=True):
        assert call["call"] == result["call"], (call, result)
        assert (call["mode"], result["status"], result["exit_status"]) == ("terminal", "ok", 0)
        assert list(result)[:6] == ["ts", "type", "agent", "session", "object", "status"]
        assert (result["agent"], result["session"]) == ("coder", session)
    reads = [e for e in host.calls(session, "tool/fs.read") if e["type"] == "tool_result"]
    assert [(e["status"], e["exit_status"]) for e in reads] == [("ok", 0), ("error", 1)], reads


def test_a_tool_installed_granted_reinstalled_and_revoked_under_a_running_terminal(
    host: CoderHost,
) -> None:
    """T-5, T-8, H-4, P-6: a tool installed while the terminal runs is not seen until both
    policies allow it (installing grants nothing); once granted, ``which`` and a call find it
    with no ``rehash``; a reinstall is what ``describe`` and the next call get; revoked in the
    tool's policy, it is gone from ``tools`` (after ``rehash`` as without) and a call is 127,
    with only the calls that ran in the session."""
    term = host.start()
    session, listening_at = term.session, term.listening_at
    with closing_all() as opened:
        typist = attach(listening_at, opened)
        assert typist.answer("which demo.late") == "tsh: demo.late: not on CTX_PATH\n"
        host.install("demo.late", '#!/bin/sh\necho late-v1 "$@"\n', "The first version.")
        assert typist.answer("which demo.late") == "tsh: demo.late: not on CTX_PATH\n"
        host.grant_in_tool("demo.late")  # the agent's own policy already names it

        def which_finds() -> bool:
            return typist.answer("which demo.late") == "/ctx/tool/demo.late\n"

        assert wait_for(which_finds, 10, step=0.2), typist.text()[-500:]
        assert "demo.late" in typist.answer("tools").splitlines()
        assert typist.answer("demo.late one") == "late-v1 one\n"
        assert typist.answer("pin demo.late") == "demo.late: The first version.  (pinned)\n"

        host.install("demo.late", '#!/bin/sh\necho late-v2 "$@"\n', "The second version.")
        described = json.loads(typist.answer("describe demo.late"))
        assert described["description"] == "The second version.\n", described
        assert described["path"] == "/ctx/tool/demo.late", described
        assert typist.answer("demo.late two") == "late-v2 two\n"  # the reinstall kept the grant

        policy = host.storage / "tool" / "demo.late.d" / "policy"
        policy.write_text("".join(line for line in policy.read_text().splitlines(True)
                                  if "coder_t" not in line))  # fmt: skip

        def gone() -> bool:
            listed = typist.answer("tools").splitlines()
            return "demo.late" not in listed and typist.answer("which demo.late") == (
                "tsh: demo.late: not on CTX_PATH\n"
            )

        # pinned, its path is kept, yet checked before use: no rehash is needed
        assert wait_for(gone, 10, step=0.2), typist.text()[-500:]
        assert typist.answer("rehash") == ""
        assert typist.answer("describe demo.late") == (
            "tsh: describe: demo.late: not a tool on CTX_PATH\n"
        )
        shown = typist.answer("demo.late three")
        assert shown == (
            "tsh: demo.late: not a tool on CTX_PATH (tsh runs CortexFS tools only)\n"
        ), shown
        assert exit_tsh(host, typist, session) == 127
    results = [e for e in host.calls(session, "tool/demo.late") if e["type"] == "tool_result"]
    assert [(e["status"], e["exit_status"]) for e in results] == [("ok", 0), ("ok", 0)], results


def test_a_tool_it_may_not_run_and_a_damaged_one_are_refused_with_the_documented_errors(
    host: CoderHost,
) -> None:
    """P-6, T-4, T-7, H-1: tools in the agent's own tier (``/ctx/home/<uid>/tool``, on its
    CTX_PATH and shown in its view) that its policy does not grant, or whose controls are
    damaged, are found by ``which`` but refused by the host: tsh says ``EACCES: step 5 …`` or
    ``ENOEXEC: … is damaged …`` and the status is 126; ``describe`` still shows the damaged
    one without its cap; each refusal is a ``tool_call``/``tool_result`` pair naming the
    errno and stage; granting the tool while the terminal runs lets the next call through."""
    for name in ("home.guarded", "home.broken"):
        host.install(name, f"#!/bin/sh\necho ran-{name}\n")
    tier = host.storage / "home" / str(host.uid) / "tool"
    tier.mkdir(parents=True, exist_ok=True)
    for directory in (tier.parent, tier):
        directory.chmod(0o755)
    for name in ("home.guarded", "home.broken"):  # root's files in the agent's tier
        for entry in (f"{name}.d", name):  # the system tier keeps no tool of that name
            (host.storage / "tool" / entry).rename(tier / entry)
        host.grant_in_tool(name, tier)
    with (host.storage / "agent" / "coder.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:home.broken execute\n")
    (tier / "home.broken.d" / "cap").write_text("{not json")

    term = host.start()
    session, listening_at = term.session, term.listening_at
    with closing_all() as opened:
        typist = attach(listening_at, opened)
        home = f"/ctx/home/{host.uid}/tool"
        shown = typist.answer("which home.guarded home.broken")
        assert shown == f"{home}/home.guarded\n{home}/home.broken\n", shown
        shown = typist.answer("home.guarded")
        assert shown == (
            "tsh: home.guarded: EACCES: step 5 (object policy): agent/coder.d/policy has no "
            "rule 'allow coder_t tool:home.guarded execute'\n"
        ), shown
        shown = typist.answer("home.broken x")
        assert shown.startswith("tsh: home.broken: ENOEXEC: tool home.broken in "), shown
        assert "is damaged: the cap control is not JSON" in shown, shown
        assert "ran-" not in typist.text()
        described = json.loads(typist.answer("describe home.broken"))
        assert (described["cap"], described["path"]) == (None, f"{home}/home.broken"), described

        with (host.storage / "agent" / "coder.d" / "policy").open("a") as policy:
            policy.write("allow coder_t tool:home.guarded execute\n")
        assert typist.answer("home.guarded") == "ran-home.guarded\n"  # read at every call
        assert typist.answer("home.broken").startswith("tsh: home.broken: ENOEXEC: ")
        assert exit_tsh(host, typist, session) == 126

    guarded = host.calls(session, f"home/{host.uid}/tool/home.guarded")
    assert [e["type"] for e in guarded] == ["tool_call", "tool_result"] * 2, guarded
    refused = guarded[1]
    assert (refused["status"], refused["errno"], refused["stage"], refused["step"]) == (
        "error", "EACCES", "authorize", 5,
    ), refused  # fmt: skip
    assert refused["exit_status"] is None, refused
    assert (guarded[3]["status"], guarded[3]["exit_status"]) == ("ok", 0), guarded[3]
    broken = host.calls(session, f"home/{host.uid}/tool/home.broken")
    results = [e for e in broken if e["type"] == "tool_result"]
    assert [(e["errno"], e["exit_status"]) for e in results] == [("ENOEXEC", None)] * 2, broken
    assert [e["argv"] for e in broken if e["type"] == "tool_call"] == [["x"], []]


@pytest.mark.xfail(
    strict=True,
    reason="T-4 read literally (the first hit on CTX_PATH decides, the chain refuses it) and "
    "T-5 (the view hides it from the terminal's which) disagree; docs/tools.md says so",
)
def test_the_tool_a_call_runs_is_the_one_which_names_in_the_agents_view(host: CoderHost) -> None:
    """T-4, T-5, H-4: in the terminal CTX_PATH is authoritative and names the agent's view,
    where a system tool the agent may not run is not there; ``which`` then names the tool of
    the same name in the agent's own tier, and a call of that name must run what ``which``
    named (docs: the path cache and ``which`` resolve "as CTX_PATH does"), not be refused for
    a tool the agent cannot even see."""
    host.install("shadow.tool", "#!/bin/sh\necho ran-the-hidden-one\n")
    tier = host.storage / "home" / str(host.uid) / "tool"
    tier.mkdir(parents=True, exist_ok=True)
    for directory in (tier.parent, tier):
        directory.chmod(0o755)
    shutil.copytree(host.storage / "tool" / "shadow.tool.d", tier / "shadow.tool.d")
    (tier / "shadow.tool").write_text("#!/bin/sh\necho ran-the-agents-own\n")
    (tier / "shadow.tool").chmod(0o755)
    host.grant_in_tool("shadow.tool", tier)  # the system one stays ungranted in its own policy
    with (host.storage / "agent" / "coder.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:shadow.tool execute\n")

    term = host.start()
    session, listening_at = term.session, term.listening_at
    with closing_all() as opened:
        typist = attach(listening_at, opened)
        assert "shadow.tool" in typist.answer("tools").splitlines()
        named = f"/ctx/home/{host.uid}/tool/shadow.tool"
        assert typist.answer("which shadow.tool") == named + "\n"
        shown = typist.answer("shadow.tool")
    calls = [e["object"] for e in host.events(session) if e["type"] == "tool_call"]
    assert calls == [f"home/{host.uid}/tool/shadow.tool"], calls
    assert shown == "ran-the-agents-own\n", shown


def test_tsh_granted_as_a_tool_and_tsh_config_typed_by_the_agent_read_but_never_act(
    host: CoderHost,
) -> None:
    """H-2, H-4, T-5 (docs: "tsh is also a tool an agent may be granted"): ``tsh`` typed in
    the terminal runs as a tool on the host and sees only the agent's view (its ``tools`` and
    ``which`` agree with the built-ins) but runs no tool (EACCES, 126); ``tsh.config`` typed
    by the agent shows the settings yet may not change them (EACCES naming who may and how,
    the file untouched); each is a recorded call."""
    host.grant_in_tool("tsh")
    with (host.storage / "agent" / "coder.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:tsh execute\n")
    config = host.storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()

    term = host.start()
    session, listening_at = term.session, term.listening_at
    with closing_all() as opened:
        typist = attach(listening_at, opened)
        builtin = typist.answer("tools")
        assert builtin.splitlines() == sorted([*TOOLS, "tsh"]), builtin
        assert typist.answer("tsh tools") == builtin
        assert typist.answer("tsh which fs.read") == "/ctx/tool/fs.read\n"
        shown = typist.answer("tsh fs.read notes.txt")
        assert shown.startswith(
            "tsh: fs.read: EACCES: this tsh runs as a tool of agent coder, not in its terminal"
        ), shown
        assert NOTE not in shown

        shown = typist.answer("tsh.config")
        assert shown.splitlines() == [
            "max_loaded_tools=64",
            "cache_capacity=32",
            "window_percent=1",
        ], shown
        shown = typist.answer("tsh.config max_loaded_tools=3")
        assert shown.startswith("tsh.config: EACCES: "), shown
        assert "'ctx tool tsh.config KEY=VALUE'" in shown, shown  # who may, and how
        assert config.read_bytes() == before
        assert exit_tsh(host, typist, session) == 1

    results = {
        (e["object"], e["exit_status"]) for e in host.events(session) if e["type"] == "tool_result"
    }
    assert results == {
        ("tool/tsh", 0),
        ("tool/tsh", 126),
        ("tool/tsh.config", 0),
        ("tool/tsh.config", 1),
    }, results
    argv = [e["argv"] for e in host.calls(session, "tool/tsh") if e["type"] == "tool_call"]
    assert argv == [["tools"], ["which", "fs.read"], ["fs.read", "notes.txt"]], argv
