"""End-to-end flows of SPEC §7 and §8 as their letter reads: an agent made from a request
file, terminals started from the directories a user stands in, joined through the A-2 socket,
a child made in its parent's terminal and started in turn, ``agent.update`` at its 8 KiB
bound, and ``ctx tool`` facing every core tool that acts for an agent."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import Raw
from tests.support.storage import copy_of_root

needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the agent runs as nobody, a uid only root may give it"
)

SCRATCH = scratch_top(__file__)
TEAM = 4242  # the group of the shared space of the A-4 flow


# ------------------------------------------------------------------ the world and its helpers


@dataclass
class World(OnStorage):
    """A storage root in a directory every uid may search, beside the user's directories."""

    base: Path
    storage: Path

    def folder(self, name: str, files: dict[str, str] | None = None, mode: int = 0o755) -> Path:
        path = self.base / name
        path.mkdir()
        for file, text in (files or {}).items():
            (path / file).write_text(text)
            (path / file).chmod(0o644)
        path.chmod(mode)
        return path

    def allow_tool(self, label: str, *tools: str) -> None:
        """The tool layer of P-6 (the agent layer comes from the request's ``tools``)."""
        for tool in tools:
            with (self.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow {label} tool:{tool} execute\n")

    def grant(self, agent: str, *rules: str) -> None:
        """Append rules to the agent's own policy, as the host that owns it does."""
        label = (self.storage / "agent" / f"{agent}.d" / "label").read_text().strip()
        with (self.storage / "agent" / f"{agent}.d" / "policy").open("a") as policy:
            for rule in rules:
                policy.write(f"allow {label} {rule}\n")

    def link(self, uid: int, agent: str, session: str) -> Path:
        """A-2: the terminal socket's place in the storage root."""
        home = self.storage / "home" / str(uid) / "agent" / agent
        return home / "session" / session / "terminal" / "main.sock"

    def events(self, uid: int, agent: str, session: str) -> list[dict]:
        path = self.storage / "home" / str(uid) / "agent" / agent / "session" / session
        path = path / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def calls(self, uid: int, agent: str, session: str, tool: str) -> list[dict]:
        return [
            e
            for e in self.events(uid, agent, session)
            if e.get("object") == f"tool/{tool}" and e["type"] in ("tool_call", "tool_result")
        ]


@pytest.fixture
def w(_template: Path) -> Iterator[World]:
    base = new_scratch_dir(SCRATCH)
    try:
        yield World(base, copy_of_root(_template, base / "storage"))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def create_from_file(w: World, request: dict, *options: str) -> dict:
    """``ctx agent create REQUEST.json`` (A-3), the request in a file of the current directory."""
    name = f"{request['name']}.request.json"
    (w.base / name).write_text(json.dumps(request, indent=2))
    made = w.ctx("agent", "create", name, "--json", *options, cwd=w.base)
    assert made.rc == 0, made
    return made.json()


@contextlib.contextmanager
def terminal(w: World, agent: str, session: str, cwd: Path) -> Iterator[dict]:
    """``ctx agent start AGENT --session S`` from ``cwd`` (A-1); always stopped after."""
    started = w.ctx("agent", "start", agent, "--session", session, "--json", cwd=cwd)
    assert started.rc == 0, started
    try:
        yield started.json()
    finally:
        w.ctx("agent", "stop", agent, "--session", session)


def ask(client: Raw, prompt: str, line: str, seconds: float = 20) -> str:
    """Type ``line`` at tsh's ``prompt``; what tsh printed before its next prompt."""
    before = client.count(prompt)
    client.type(line)
    assert client.shows(prompt, before + 1, seconds), client.text()[-800:]
    said = client.text().split(prompt)[before]
    assert said.startswith(line + "\n"), (line, said[:300])
    return said.removeprefix(line + "\n")


def joined(path: Path, prompt: str, mode: bytes = b"attach\n") -> Raw:
    client = Raw(path, mode)
    assert client.shows(prompt), client.text()
    return client


class Watch:
    """``ctx agent watch AGENT --session S`` running, its output collected as it comes."""

    def __init__(self, w: World, agent: str, session: str) -> None:
        argv = [*CTX_ARGV, "agent", "watch", agent, "--session", session]
        self.proc = subprocess.Popen(
            argv,
            env=w.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.out = b""
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.out += chunk

    def shows(self, text: str, seconds: float = 20) -> bool:
        return wait_for(lambda: text.encode() in self.out, seconds)

    def end(self) -> tuple[int | None, str]:
        """Wait a little for it to end on its own, else stop it; its status and stderr."""
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.reader.join(timeout=5)
        self.proc.stdin.close()
        err = self.proc.stderr.read().decode("utf-8", "replace")
        self.proc.stderr.close()
        self.proc.stdout.close()
        return self.proc.returncode, err


def native(w: World, agent: str, tool: str, payload: dict, session: str) -> tuple[Run, dict]:
    r = w.ctx(
        "run",
        "--native",
        "--agent",
        agent,
        "--session",
        session,
        tool,
        input=json.dumps(payload),
    )
    frames = [json.loads(line) for line in r.lines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", r
    return r, frames[-1]


def query(policy: Path, label: str, rule: str) -> str:
    return ctx_run("policy", "query", "--policy", policy, label, *rule.split()).out.strip()


# ------------------------------------------------------------------


@needs_terminal
def test_one_agent_two_sessions_started_from_two_directories_are_two_terminals(w: World) -> None:
    """A-3, A-1, A-2, R-2: an agent made from a request file is started twice, from two
    directories, in two sessions: each terminal has its own socket in its own session
    directory, its own /workspace and its own events; a watcher of one never sees the
    other; stopping one leaves the other working, and the root keeps its six entries."""
    made = create_from_file(
        w,
        {
            "name": "coder",
            "label": "coder_t",
            "model": [],
            "tools": ["fs.read", "fs.list"],
            "shared": {},
            "mount": [],
        },
    )
    uid = made["identity"]["uid"]
    entry = w.storage / "agent" / "coder"
    assert stat.S_ISREG(entry.lstat().st_mode) and os.access(entry, os.X_OK)
    assert (w.storage / "agent" / "coder.d").is_dir()
    assert set(os.listdir(w.storage)) == ROOT_ENTRIES
    w.allow_tool("coder_t", "fs.read", "fs.list")
    left = w.folder("left", {"left.txt": "written on the left\n"})
    right = w.folder("right", {"right.txt": "written on the right\n"})

    with (
        terminal(w, "coder", "left", left) as lt,
        terminal(w, "coder", "right", right) as rt,
    ):
        links = {s: w.link(uid, "coder", s) for s in ("left", "right")}
        for session, link in links.items():
            assert stat.S_ISSOCK(os.stat(link).st_mode), link
            assert os.path.samefile(link, (lt if session == "left" else rt)["listening_at"])
        assert not os.path.samefile(links["left"], links["right"])
        assert set(os.listdir(w.storage)) == ROOT_ENTRIES

        watcher = Watch(w, "coder", "right")
        on_left = joined(links["left"], "coder$ ")
        on_right = joined(Path(rt["listening_at"]), "coder$ ")
        try:
            listed = ask(on_left, "coder$ ", "fs.list /workspace")
            assert "left.txt" in listed and "right.txt" not in listed, listed
            assert ask(on_left, "coder$ ", "fs.read left.txt") == "written on the left\n"
            missing = ask(on_left, "coder$ ", "fs.read right.txt")
            assert "written on the right" not in missing and "ENOENT" in missing, missing
            assert "right.txt" in ask(on_right, "coder$ ", "fs.list")
            top = ask(on_right, "coder$ ", "fs.list /ctx").split()
            assert {name.rstrip("/") for name in top} == ROOT_ENTRIES, top
            assert watcher.shows("right.txt"), watcher.out[-500:]
            assert b"written on the left" not in watcher.out
            assert b"left.txt" not in watcher.out

            stopped = w.ctx("agent", "stop", "coder", "--session", "left")
            assert stopped.rc == 0, stopped
            assert on_left.eof.wait(15), on_left.text()[-300:]
            assert not os.path.lexists(links["left"])
            gone = w.ctx("agent", "watch", "coder", "--session", "left")
            assert gone.rc == 1 and "ENOENT" in gone.err, gone
            assert ask(on_right, "coder$ ", "fs.read right.txt") == "written on the right\n"
        finally:
            on_left.close()
            on_right.close()
            w.ctx("agent", "stop", "coder", "--session", "right")
            status, said = watcher.end()
        assert status == 0, said

    def argvs(session: str) -> list[list[str]]:
        return [
            e["argv"]
            for e in w.events(uid, "coder", session)
            if e["type"] == "tool_call" and e["object"] == "tool/fs.read"
        ]

    assert argvs("left") == [["left.txt"], ["right.txt"]]
    assert argvs("right") == [["right.txt"]]
    assert set(os.listdir(w.storage)) == ROOT_ENTRIES


def test_illegal_or_unknown_sessions_are_refused_and_nothing_is_made(w: World) -> None:
    """R-3, A-2: a session is an object name; start, watch, attach and stop refuse an illegal
    one with EINVAL (exit 2), and watching or attaching to a session never started is
    ENOENT (exit 1); none of them makes a session, a socket or a root entry."""
    made = create_from_file(w, {"name": "coder", "label": "coder_t"})
    home = w.storage / "home" / str(made["identity"]["uid"])
    before = sorted(p.relative_to(w.storage) for p in w.storage.rglob("*"))
    for session in ("../../evil", "s.d"):
        for command in ("start", "watch", "attach", "stop"):
            r = w.ctx("agent", command, "coder", "--session", session, cwd=w.base)
            assert r.rc == 2 and "EINVAL" in r.err, r
    for command in ("watch", "attach"):
        r = w.ctx("agent", command, "coder", "--session", "typo")
        assert r.rc == 1 and "ENOENT" in r.err, r
    assert sorted(p.relative_to(w.storage) for p in w.storage.rglob("*")) == before
    assert not (home / "agent" / "coder" / "session" / "typo").exists()
    assert not (w.base / "evil").exists() and not (w.storage / "evil").exists()


@needs_terminal
def test_the_requests_mounts_decide_what_its_terminal_reads_and_writes(w: World) -> None:
    """A-3 ``mount`` with A-1 and H-1: a request mounting a source read-only at /workspace
    and another read-write at /out: the terminal starts in that /workspace whatever directory
    it was started from, reads there, cannot write there (EROFS), writes /out as the agent's
    uid, reaches no host path outside its mounts, and runs no executable it finds there."""
    marks = w.folder("marks", mode=0o1777)
    program = f"#!/bin/sh\ntouch {marks}/ran\necho ran\n"
    src = w.folder("src", {"notes.txt": "read me\n", "build.sh": program})
    (src / "build.sh").chmod(0o755)
    out = w.folder("out", mode=0o777)
    elsewhere = w.folder("elsewhere", {"here.txt": "where the user stood\n"})
    made = create_from_file(
        w,
        {
            "name": "rev",
            "label": "rev_t",
            "tools": ["fs.read", "fs.list", "fs.write"],
            "mount": [[str(src), "/workspace", "ro"], [str(out), "/out", "rw"]],
        },
    )
    uid = made["identity"]["uid"]
    w.allow_tool("rev_t", "fs.read", "fs.list", "fs.write")
    with terminal(w, "rev", "w", elsewhere) as started:
        assert os.path.samefile(started["workspace"], src), started
        typist = joined(w.link(uid, "rev", "w"), "rev$ ")
        try:
            listed = ask(typist, "rev$ ", "fs.list").split()
            assert sorted(listed) == ["build.sh", "notes.txt"], listed
            assert ask(typist, "rev$ ", "fs.read notes.txt") == "read me\n"
            refused = ask(typist, "rev$ ", """fs.write '{"path": "new.txt", "content": "x"}'""")
            assert "EROFS" in refused, refused
            wrote = ask(typist, "rev$ ", """fs.write '{"path": "/out/r.txt", "content": "ok"}'""")
            assert "EROFS" not in wrote and "EACCES" not in wrote, wrote
            host = ask(typist, "rev$ ", f"fs.read {elsewhere}/here.txt")
            assert "EACCES" in host and "where the user stood" not in host, host
            for line in ("build.sh", "./build.sh", "/workspace/build.sh"):
                assert "not a tool" in ask(typist, "rev$ ", line), line
        finally:
            typist.close()
    assert not (src / "new.txt").exists()
    assert (out / "r.txt").read_text() == "ok"
    assert (out / "r.txt").stat().st_uid == uid
    assert not (marks / "ran").exists()
    assert sorted(os.listdir(elsewhere)) == ["here.txt"]
    results = [
        e["status"] for e in w.calls(uid, "rev", "w", "fs.write") if e["type"] == "tool_result"
    ]
    assert results == ["error", "ok"], results


@needs_terminal
def test_the_default_workspace_grants_no_more_than_linux_does(w: World) -> None:
    """A-1 with P-5 step 2: started from a directory of root's, the terminal starts in
    /workspace, where the agent reads what its uid may read and nothing else: a 0600 file and
    a file in a 0700 directory are refused, writing in a directory it may not write is
    refused, and the host files stay as they were."""
    desk = w.folder("desk", {"open.txt": "anyone may read this\n", "secret.txt": "root only\n"})
    (desk / "secret.txt").chmod(0o600)
    locked = desk / "locked"
    locked.mkdir(mode=0o700)
    (locked / "inner.txt").write_text("behind 0700\n")
    (locked / "inner.txt").chmod(0o644)
    made = create_from_file(
        w, {"name": "coder", "label": "coder_t", "tools": ["fs.read", "fs.list", "fs.write"]}
    )
    uid = made["identity"]["uid"]
    assert uid != 0
    w.allow_tool("coder_t", "fs.read", "fs.list", "fs.write")
    with terminal(w, "coder", "desk", desk):
        typist = joined(w.link(uid, "coder", "desk"), "coder$ ")
        try:
            assert ask(typist, "coder$ ", "fs.read open.txt") == "anyone may read this\n"
            secret = ask(typist, "coder$ ", "fs.read /workspace/secret.txt")
            assert "EACCES" in secret and "root only" not in secret, secret
            put = ask(typist, "coder$ ", """fs.write '{"path": "mine.txt", "content": "x"}'""")
            assert "EACCES" in put, put
            inner = ask(typist, "coder$ ", "fs.read locked/inner.txt")
            assert "EACCES" in inner and "behind 0700" not in inner, inner
        finally:
            typist.close()
    assert sorted(os.listdir(desk)) == ["locked", "open.txt", "secret.txt"]
    assert (desk / "secret.txt").read_text() == "root only\n"


# ------------------------------------------------------------------ a child of its own


@needs_terminal
def test_a_child_made_in_its_parents_terminal_starts_a_terminal_with_only_its_grants(
    w: World,
) -> None:
    """A-4, A-1, A-2, P-7: typed in the parent's terminal, agent.create refuses a child
    asking more of a space than the parent holds, then makes ``helper`` with part of the
    parent's grants and mount; the host starts the child's own terminal, which runs as the
    parent's uid, has its socket in the child's session and runs fs.read on its mount but
    neither the parent's other tools nor agent.create."""
    ws = w.folder("ws", {"notes.txt": "workspace notes\n"})
    space = w.ctx("shared", "create", "team", "--group", str(TEAM))
    assert space.rc == 0, space
    brief = w.storage / "shared" / "team" / "data" / "brief.txt"
    brief.write_text("the team's brief\n")
    brief.chmod(0o640)
    os.chown(brief, 0, TEAM)
    made = create_from_file(
        w,
        {
            "name": "parent",
            "label": "parent_t",
            "tools": ["fs.read", "fs.list", "agent.create"],
            "shared": {"team": ["read"]},
            "mount": [[str(ws), "/workspace", "ro"]],
        },
        "--groups",
        str(TEAM),
    )
    uid = made["identity"]["uid"]
    w.allow_tool("parent_t", "fs.read", "fs.list", "agent.create")
    w.grant("parent", "agent:helper create", "agent:greedy create")
    greedy = {
        "name": "greedy",
        "label": "greedy_t",
        "tools": ["fs.read"],
        "shared": {"team": ["read", "write"]},
    }
    helper = {
        "name": "helper",
        "label": "helper_t",
        "tools": ["fs.read"],
        "shared": {"team": ["read"]},
        "mount": [["/workspace", "/data", "ro"]],
    }

    with terminal(w, "parent", "make", ws):
        typist = joined(w.link(uid, "parent", "make"), "parent$ ")
        try:
            refused = ask(typist, "parent$ ", f"agent.create '{json.dumps(greedy)}'")
            assert "EACCES" in refused, refused
            said = ask(typist, "parent$ ", f"agent.create '{json.dumps(helper)}'")
            assert said.strip() == "created agent helper", said
        finally:
            typist.close()
    assert not (w.storage / "agent" / "greedy").exists()
    assert not (w.storage / "agent" / "greedy.d").exists()
    results = [e["status"] for e in w.calls(uid, "parent", "make", "agent.create")]
    assert results == ["ok", "error", "ok", "ok"], results  # call, result, call, result

    controls = w.storage / "agent" / "helper.d"
    assert (w.storage / "agent" / "helper").is_file()
    shown = w.ctx("agent", "show", "helper", "--json")
    assert shown.rc == 0 and shown.json()["identity"]["uid"] == uid, shown
    for rule, decision in (
        ("shared:team read", "allow"),
        ("shared:team write", "deny"),
        ("tool:fs.read execute", "allow"),
        ("tool:fs.list execute", "deny"),
        ("tool:agent.create execute", "deny"),
    ):
        assert query(controls / "policy", "helper_t", rule) == decision, rule
    assert set(os.listdir(w.storage)) == ROOT_ENTRIES

    w.allow_tool("helper_t", "fs.read")
    cwd = w.folder("child-cwd")
    with terminal(w, "helper", "own", cwd):
        link = w.link(uid, "helper", "own")
        assert stat.S_ISSOCK(os.stat(link).st_mode), link
        child = joined(link, "helper$ ")
        try:
            assert ask(child, "helper$ ", "fs.read /data/notes.txt") == "workspace notes\n"
            said = ask(child, "helper$ ", "fs.read /ctx/shared/team/data/brief.txt")
            assert said == "the team's brief\n", said
            tools = ask(child, "helper$ ", "tools").split()
            assert "fs.read" in tools and "fs.list" not in tools, tools
            assert "agent.create" not in tools, tools
            assert "not a tool" in ask(child, "helper$ ", "fs.list /data")
            again = json.dumps({"name": "g2", "label": "g2_t"})
            assert "not a tool" in ask(child, "helper$ ", f"agent.create '{again}'")
        finally:
            child.close()
    assert not (w.storage / "agent" / "g2.d").exists()
    reads = [e["type"] for e in w.calls(uid, "helper", "own", "fs.read")]
    assert reads == ["tool_call", "tool_result"] * 2, reads


# ------------------------------------------------------------------ 8 KiB


@needs_root
def test_agent_update_takes_exactly_8_kib_in_both_modes_and_not_one_byte_more(w: World) -> None:
    """A-5: "rejects payloads over 8 KiB": 8192 bytes of UTF-8 are taken whole (ASCII, or
    three-byte characters ending on the bound), through ``ctx run`` in terminal and native
    mode, for system.md and prompt.template.md; 8193 bytes are refused (EFBIG, the docs'
    word) and leave the file as it was; every call is a tool_call/tool_result pair."""
    made = create_from_file(w, {"name": "coder", "label": "coder_t", "tools": ["agent.update"]})
    uid = made["identity"]["uid"]
    w.allow_tool("coder_t", "agent.update")
    controls = w.storage / "agent" / "coder.d"

    ascii_full = "a" * 8191 + "\n"
    r = w.ctx(
        "run",
        "--agent",
        "coder",
        "--session",
        "bound",
        "agent.update",
        json.dumps({"control": "system.md", "content": ascii_full}),
    )
    assert (r.rc, r.out) == (0, "system.md of agent coder updated\n"), r
    assert (controls / "system.md").read_bytes() == ascii_full.encode()

    euro_full = "€" * 2730 + "ok"
    assert len(euro_full.encode()) == 8192
    ran, result = native(
        w, "coder", "agent.update", {"control": "prompt.template.md", "content": euro_full}, "bound"
    )
    assert (ran.rc, result["status"]) == (0, "ok"), result
    assert result["output"]["bytes"] == 8192, result
    assert (controls / "prompt.template.md").read_text() == euro_full

    for control in ("system.md", "prompt.template.md"):
        kept = (controls / control).read_bytes()
        ran, result = native(
            w, "coder", "agent.update", {"control": control, "content": euro_full + "!"}, "bound"
        )
        assert result["status"] == "error", result
        assert result["output"]["error"] == "EFBIG", result
        assert (controls / control).read_bytes() == kept
    kinds = [e["type"] for e in w.calls(uid, "coder", "bound", "agent.update")]
    assert kinds == ["tool_call", "tool_result"] * 4, kinds


@needs_terminal
def test_agent_update_typed_in_the_terminal_takes_a_prompt_of_6_kib(w: World) -> None:
    """A-5 with A-2 and H-1 (docs: "What an attached client types reaches tsh whole"): the
    terminal is the agent's one capability, so a prompt under the 8 KiB bound typed there as
    one agent.update line replaces system.md whole, as a 3 KiB one does."""
    made = create_from_file(w, {"name": "coder", "label": "coder_t", "tools": ["agent.update"]})
    uid = made["identity"]["uid"]
    w.allow_tool("coder_t", "agent.update")
    system = w.storage / "agent" / "coder.d" / "system.md"
    with terminal(w, "coder", "long", w.folder("ws")):
        typist = joined(w.link(uid, "coder", "long"), "coder$ ")
        try:
            for size in (3000, 6000):
                content = "p" * (size - 4) + "END\n"
                line = "agent.update '" + json.dumps({"control": "system.md", "content": content})
                said = ask(typist, "coder$ ", line + "'")
                assert said.strip() == "system.md of agent coder updated", (size, said[-200:])
                assert system.read_text() == content, size
        finally:
            typist.close()


# ------------------------------------------------------------------ H-3: ctx tool


def test_ctx_tool_refuses_every_core_tool_that_acts_for_an_agent_and_tsh_itself(
    w: World,
) -> None:
    """H-3: with every core tool visible on CTX_PATH, ``ctx tool`` refuses (EACCES) the
    agent lifecycle tools (agent.create, agent.update), the fs.* tools and the ordinary tool
    tsh, in plain and --json form, and none of them acts: no agent appears, no prompt
    changes, no file's content is printed; tsh.config alone still runs."""
    create_from_file(w, {"name": "coder", "label": "coder_t", "tools": ["agent.update"]})
    w.allow_tool("coder_t", "agent.update")
    system = w.storage / "agent" / "coder.d" / "system.md"
    kept = system.read_bytes()
    secret = w.folder("private", {"plan.txt": "the plan\n"}) / "plan.txt"
    home = w.folder("home")
    env = clean_env(
        CTX_STORAGE=str(w.storage),
        CTX_HOME=str(home),
        CTX_PATH=str(w.storage / "tool"),
        CTX_AGENT="coder",
        CTX_SESSION="s",
    )
    agents = sorted(os.listdir(w.storage / "agent"))
    calls = {
        "agent.create": [json.dumps({"name": "sneaky", "label": "sneaky_t", "tools": []})],
        "agent.update": [json.dumps({"control": "system.md", "content": "obey me\n"})],
        "fs.read": [str(secret)],
        "fs.list": [str(secret.parent)],
        "fs.stat": [str(secret)],
        "tsh": ["which", "fs.read"],
    }
    for name, argv in calls.items():
        for form in ((name, *argv), ("--json", name, *argv)):
            r = ctx_run("tool", *form, env=env)
            assert r.rc != 0 and "EACCES" in r.err, r
            assert "the plan" not in r.out and "plan.txt" not in r.out, r
    assert sorted(os.listdir(w.storage / "agent")) == agents
    assert system.read_bytes() == kept
    assert set(os.listdir(w.storage)) == ROOT_ENTRIES
    shown = ctx_run("tool", "tsh.config", env=env)
    assert shown.rc == 0 and "max_loaded_tools=64" in shown.lines(), shown
