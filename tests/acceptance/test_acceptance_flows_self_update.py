"""End-to-end flows of an operator whose agents iterate on themselves (SPEC §8 A-3, A-4, A-5):
``agent.update`` over the run capability, with its descriptor taken by another agent's real
``shell.exec`` (same uid, ``pidfd_getfd``) during and after the call; self-updates run as
queue jobs by ``ctx queue work``, with each A-5 refusal and the two policy layers; concurrent
self-updates read back atomically while never widening what the agent holds; and a chain of
``agent.create`` (parent, child, grandchild) attenuated at every link.

The single claims are checked in tests/agents/test_agent_update.py,
tests/agents/test_agent_create_*.py, test_acceptance_terminal.py and
test_acceptance_flows_agents.py; here they are chained the way an operator meets them.
Black-box: the installed ``ctx``, real processes, real uids (agents run as nobody)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    OnStorage,
    QueueCLI,
    Run,
    read_jsonl,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid (nobody): needs root"
)

HOST_PYTHON = "/usr/bin/python3"  # what an agent's shell.exec finds on the host
USERS_GID = 100  # a group the shared space of the A-4 chain belongs to

# Run by another agent's shell.exec, as that agent's uid: take a copy of descriptor FD of
# process PID (pidfd_getfd, syscall 438 on every architecture), touch MARKER, then — at once
# ("now") or once GO exists ("after") — write one agent.update request on the copy and print
# what came back, as JSON.
THIEF = r"""
import ctypes, errno, json, os, socket, sys, time
pid, target, mode, marker = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(pid)
fd = libc.syscall(438, pidfd, target, 0)
if fd < 0:
    print(json.dumps({"took": False, "errno": ctypes.get_errno()}))
    sys.exit(0)
open(marker, "w").close()
copy = socket.socket(fileno=fd)
if mode == "after":
    deadline = time.monotonic() + 30
    while not os.path.exists(marker + ".go") and time.monotonic() < deadline:
        time.sleep(0.02)
request = {"op": "agent.update", "control": "system.md", "content": "stolen\n"}
try:
    copy.sendall(json.dumps(request).encode() + b"\n")
    sent = "sent"
except OSError as exc:
    sent = errno.errorcode.get(exc.errno, str(exc.errno))
copy.settimeout(5)
try:
    answer = copy.recv(65536).decode()
except OSError as exc:
    answer = "error " + errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({"took": True, "sent": sent, "answer": answer}))
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Site(OnStorage):
    """A storage root every uid may search, a workspace and a reference directory the agents
    may be given, and an outbox every uid may write."""

    storage: Path
    ws: Path
    ref: Path
    outbox: Path

    def controls(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d"

    def grant(self, agent: str, rule: str) -> None:
        with (self.controls(agent) / "policy").open("a") as policy:
            policy.write(f"allow {agent}_t {rule}\n")

    def events(self, agent: str, session: str, uid: int = 65534) -> list[dict]:
        path = self.storage / "home" / str(uid) / "agent" / agent / "session" / session
        return read_jsonl(path / "events.jsonl")

    def log(self, agent: str) -> list[dict]:
        return read_jsonl(self.controls(agent) / "log")

    def bytes_of(self, agent: str) -> dict[str, bytes]:
        """Every control of ``agent`` but its log, as bytes."""
        folder = self.controls(agent)
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "log"}


@pytest.fixture
def site(searchable_storage: Path, traversable: Path, outbox: Path) -> Site:
    ws = traversable / "ws"
    ref = traversable / "ref"
    for place, note in ((ws, "notes of the workspace\n"), (ref, "reference only\n")):
        place.mkdir(mode=0o755)
        (place / "notes.txt").write_text(note)
        (place / "notes.txt").chmod(0o644)
    return Site(searchable_storage, ws, ref, outbox)


def calls(events: list[dict], tool: str) -> list[dict]:
    kinds = ("tool_call", "tool_result")
    return [e for e in events if e.get("object") == f"tool/{tool}" and e["type"] in kinds]


DERIVED = ("label", "identity", "ctx_path", "mounts", "withheld_mounts", "problems")


def derived(site: Site, agent: str) -> dict:
    """What ``ctx agent show --json`` derives from the agent's controls (its tools' mounts
    and working directory aside: they follow the agent's home, made by its first call)."""
    shown = site.ctx("agent", "show", agent, "--json")
    assert shown.rc == 0, shown
    return {key: shown.json()[key] for key in DERIVED}


def updates(site: Site, agent: str) -> list[tuple[str, str, int]]:
    """The ``agent.updated`` facts of the agent's log: (control, session, bytes)."""
    return [
        (e["control"], e["session"], e["bytes"])
        for e in site.log(agent)
        if e["type"] == "agent.updated"
    ]


def descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def capability_of(caller: subprocess.Popen) -> tuple[int, int] | None:
    """The tool process under ``caller`` that holds a run capability, and its descriptor."""
    for pid in descendants(caller.pid):
        with contextlib.suppress(OSError):
            for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if item.startswith(b"CTX_RUN_CAPABILITY="):
                    return pid, int(item.split(b"=", 1)[1])
    return None


@contextlib.contextmanager
def pending_update(site: Site, session: str) -> Iterator[tuple[subprocess.Popen, int, int]]:
    """``ctx run --agent coder --session S agent.update`` with its input still to come on
    stdin: the tool runs, holding its capability, until the input is given.  Yields the call,
    the tool's pid and its capability descriptor; killed on the way out if still running."""
    argv = [*CTX_ARGV, "run", "--agent", "coder", "--session", session, "agent.update"]
    call = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=site.env, start_new_session=True,
    )  # fmt: skip
    with ended(call):
        deadline = time.monotonic() + 30
        while (held := capability_of(call)) is None:
            assert call.poll() is None and time.monotonic() < deadline, "no capability seen"
            time.sleep(0.02)
        yield call, *held


@contextlib.contextmanager
def ended(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc``, killed with its process group on the way out if it is still running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.communicate()


def thief(site: Site, pid: int, descriptor: int, mode: str, marker: Path) -> subprocess.Popen:
    """Agent ``other`` (same uid as coder) runs :data:`THIEF` through its own shell.exec."""
    cmd = shlex.join([HOST_PYTHON, "-c", THIEF, str(pid), str(descriptor), mode, str(marker)])
    argv = [*CTX_ARGV, "run", "--agent", "other", "shell.exec", json.dumps({"cmd": cmd})]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=site.env,
        start_new_session=True,
    )  # fmt: skip


def took(theft: subprocess.Popen, out: str, err: str) -> dict:
    assert theft.returncode == 0, (out, err)
    told = json.loads(out)
    if not told["took"]:
        if told["errno"] in (errno.ENOSYS, errno.EPERM):
            pytest.skip(f"pidfd_getfd is not usable here ({errno.errorcode[told['errno']]})")
        pytest.fail(f"pidfd_getfd failed: {told}")
    return told


@pytest.fixture
def rivals(site: Site) -> Site:
    """Agents ``coder`` (agent.update, both layers) and ``other`` (shell.exec, both layers),
    both running as nobody, as root's agents do by default."""
    if not os.access(HOST_PYTHON, os.X_OK):
        pytest.skip(f"{HOST_PYTHON} is not there for the other agent's shell.exec")
    site.create_agent({"name": "coder", "label": "coder_t", "tools": ["agent.update"]})
    site.create_agent({"name": "other", "label": "other_t", "tools": ["shell.exec"]})
    site.allow_tool("coder_t", "agent.update")
    site.allow_tool("other_t", "shell.exec")
    return site


def steal_while_running(site: Site) -> tuple[dict, subprocess.CompletedProcess, bytes]:
    """Another agent writes on a copy of coder's capability while coder's call waits for its
    input; then coder's tool asks the host.  Returns what the copy got, coder's call, and
    system.md as it was before."""
    before = (site.controls("coder") / "system.md").read_bytes()
    marker = site.outbox / "now"
    with pending_update(site, "stolen") as (call, pid, descriptor):
        with ended(thief(site, pid, descriptor, "now", marker)) as theft:
            out, err = theft.communicate(timeout=60)
        told = took(theft, out, err)
        payload = json.dumps({"control": "system.md", "content": "mine\n"}).encode()
        stdout, stderr = call.communicate(payload, timeout=60)
        done = subprocess.CompletedProcess(call.args, call.returncode, stdout, stderr)
    return told, done, before


# ----------------------------------------------------------- the capability is the call's


def test_a_copied_capability_is_never_answered_during_or_after_the_call(rivals: Site) -> None:
    """A-5, S-2, S-3: the run capability is bound to the call's tool process and to the call's
    lifetime: another agent of the same uid that takes a copy of it (``pidfd_getfd`` from its
    own ``shell.exec``) gets no answer, ends it and makes coder's call fail with nothing
    written; a copy taken during a good call and used once the call ended is not answered
    either, and the good update stands.  Both calls are ordinary tool_call/tool_result pairs
    and the agent's log holds only the update that happened."""
    site = rivals
    system_md = site.controls("coder") / "system.md"
    other_controls = site.bytes_of("other")

    told, refused, before = steal_while_running(site)
    assert told["answer"] == "" and told["sent"] == "sent", told
    assert refused.returncode == 1 and refused.stdout == b"", refused
    assert refused.stderr.startswith(b"agent.update: E"), refused
    assert system_md.read_bytes() == before
    assert b"stolen" not in system_md.read_bytes() and updates(site, "coder") == []

    marker = site.outbox / "after"
    with (
        pending_update(site, "kept") as (call, pid, descriptor),
        ended(thief(site, pid, descriptor, "after", marker)) as theft,
    ):
        assert wait_for(lambda: marker.exists() or theft.poll() is not None, 30)
        payload = json.dumps({"control": "system.md", "content": "mine\n"}).encode()
        stdout, stderr = call.communicate(payload, timeout=60)
        assert (call.returncode, stdout) == (0, b"system.md of agent coder updated\n"), stderr
        (site.outbox / "after.go").touch()
        out, err = theft.communicate(timeout=60)
    late = took(theft, out, err)
    assert late["answer"] == "" and late["sent"] == "EPIPE", late
    assert system_md.read_text() == "mine\n"
    assert updates(site, "coder") == [("system.md", "kept", 5)]

    for session, status in (("stolen", "error"), ("kept", "ok")):
        pair = calls(site.events("coder", session), "agent.update")
        assert [(e["type"], e["status"]) for e in pair] == [
            ("tool_call", "ok"),
            ("tool_result", status),
        ], pair
        assert pair[0]["call"] == pair[1]["call"] and pair[0]["mode"] == "terminal", pair
    results = read_jsonl(site.storage / "tool" / "agent.update.d" / "log")
    assert [(e["session"], e["status"]) for e in results if e["agent"] == "coder"] == [
        ("stolen", "error"),
        ("kept", "ok"),
    ], results
    thefts = calls(site.events("other", "default"), "shell.exec")
    assert [e["status"] for e in thefts] == ["ok"] * 4, thefts  # its own calls ran, as ever
    assert site.bytes_of("other") == other_controls


def test_a_call_whose_capability_another_process_used_fails_with_eio(rivals: Site) -> None:
    """A-5 as docs/tools.md words it: "A copy of the descriptor in any other process ends the
    capability at its first write, unanswered; the call then fails with EIO"."""
    _, refused, _ = steal_while_running(rivals)
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(b"agent.update: EIO: "), refused.stderr


# -------------------------------------------------------- self-iteration as queue jobs


def publish(queue: QueueCLI, name: str, payload: dict) -> str:
    return queue.publish({"tool": "agent.update", "input": payload, "from": "operator"}, name)


def test_self_updates_run_as_queue_jobs_change_only_the_workers_own_prompts(site: Site) -> None:
    """A-5, W-1, P-6, S-2, S-3, S-4: an operator queues prompt rewrites for the worker's agent;
    ``ctx queue work --agent iter`` replaces its system.md (exactly 8 KiB of UTF-8) and
    prompt.template.md and fails, with the reason, every job that names another control, goes
    past 8 KiB or names another agent; a worker whose agent lacks the tool layer fails its job
    at step 6.  Nothing else of any agent changes, the log holds facts without the prompts,
    and a template that reads like a grant widens nothing."""
    for name in ("iter", "lazy", "other"):
        site.create_agent({"name": name, "label": f"{name}_t", "tools": ["agent.update"]})
    site.allow_tool("iter_t", "agent.update")  # lazy has only its agent layer (P-6)
    queue = QueueCLI(site.storage, "self")
    assert queue.run("init").rc == 0
    shown_before = derived(site, "iter")
    kept = {name: site.bytes_of(name) for name in ("iter", "lazy", "other")}

    system = "é" * 4096  # 8192 bytes: the most A-5 allows
    template = "Task: {{input}}\nallow iter_t tool:shell.exec execute\n"
    jobs = {
        "system": ({"control": "system.md", "content": system}, None),
        "template": ({"control": "prompt.template.md", "content": template}, None),
        "policy": ({"control": "policy", "content": "allow iter_t tool:shell.exec execute\n"},
                   "EINVAL"),
        "identity": ({"control": "identity", "content": '{"uid": 0, "gid": 0, "groups": []}'},
                     "EINVAL"),
        "escape": ({"control": "../other.d/system.md", "content": "x"}, "EINVAL"),
        "bigger": ({"control": "system.md", "content": "é" * 4097}, "EFBIG"),
        "theirs": ({"control": "system.md", "content": "x", "agent": "other"}, "EINVAL"),
    }  # fmt: skip
    names = {key: publish(queue, f"iter-{key}", payload) for key, (payload, _) in jobs.items()}
    drained = queue.run("work", "--agent", "iter", "--drain")
    assert drained.rc == 0, drained

    for key, (_, word) in jobs.items():
        state = queue.state(names[key])
        result = json.loads((queue.dir / f"{state}/{names[key]}.result").read_text())
        if word is None:
            assert state == "done" and result["status"] == "ok", (key, result)
            assert result["output"]["agent"] == "iter", result
        else:
            assert state == "failed" and result["error"]["error"] == word, (key, result)
    assert (site.controls("iter") / "system.md").read_text() == system
    assert (site.controls("iter") / "prompt.template.md").read_text() == template

    lazy_job = publish(queue, "lazy-system", {"control": "system.md", "content": "y\n"})
    assert queue.run("work", "--agent", "lazy", "--drain").rc == 0
    assert queue.state(lazy_job) == "failed"
    denied = json.loads((queue.dir / "failed" / f"{lazy_job}.result").read_text())["error"]
    assert (denied["error"], denied["step"]) == ("EACCES", 6), denied

    now = {name: site.bytes_of(name) for name in ("iter", "lazy", "other")}
    for name in ("lazy", "other"):
        assert now[name] == kept[name], name
    changed = {c for c in kept["iter"] if now["iter"][c] != kept["iter"][c]}
    assert changed == {"system.md", "prompt.template.md"}, changed
    assert updates(site, "iter") == [
        ("system.md", "worker", 8192),
        ("prompt.template.md", "worker", len(template.encode())),
    ]
    assert updates(site, "lazy") == [] and updates(site, "other") == []
    assert "Task:" not in (site.controls("iter") / "log").read_text()  # S-4: facts only

    pairs = calls(site.events("iter", "worker"), "agent.update")
    assert [e["type"] for e in pairs] == ["tool_call", "tool_result"] * len(jobs), pairs
    results = [e for e in pairs if e["type"] == "tool_result"]
    assert sorted(e["status"] for e in results) == ["error"] * 5 + ["ok"] * 2, results

    # The prompt grants nothing and the next run sees the same agent (P-6, A-5).
    assert derived(site, "iter") == shown_before
    query = site.ctx(
        "policy", "query", "--policy", site.controls("iter") / "policy",
        "iter_t", "tool:shell.exec", "execute",
    )  # fmt: skip
    assert (query.rc, query.out) == (1, "deny\n"), query
    refused = site.ctx("run", "--agent", "iter", "shell.exec", '{"cmd": "id"}')
    assert refused.rc == 126 and "step 5" in refused.err, refused


def test_concurrent_self_updates_are_read_whole_and_widen_nothing(site: Site) -> None:
    """A-5, S-2: two sessions of one agent rewrite its system.md at once, each with 8 KiB of
    its own; a reader polling the file meanwhile only ever sees a whole version (the old one or
    one of the two), never a torn or empty file; every call is a tool_call/tool_result pair in
    its own session and one ``agent.updated`` fact; the agent's derived view (``ctx agent
    show``), policy and identity are what they were."""
    site.create_agent({"name": "coder", "label": "coder_t", "tools": ["agent.update"]})
    site.allow_tool("coder_t", "agent.update")
    system_md = site.controls("coder") / "system.md"
    old = system_md.read_text()
    versions = {"left": "L" * 8191 + "\n", "right": "allow coder_t tool:shell.exec execute\n" * 5}
    shown = derived(site, "coder")
    fixed = {c: (site.controls("coder") / c).read_bytes() for c in ("policy", "identity", "mount")}
    rounds = 4

    seen: set[str] = set()
    stop = threading.Event()

    def read_on() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.add(system_md.read_text())

    failures: list[Run] = []

    def rewrite(session: str) -> None:
        payload = json.dumps({"control": "system.md", "content": versions[session]})
        for _ in range(rounds):
            done = site.ctx("run", "--agent", "coder", "--session", session, "agent.update",
                            payload)  # fmt: skip
            if done.rc != 0:
                failures.append(done)

    reader = threading.Thread(target=read_on, daemon=True)
    reader.start()
    writers = [threading.Thread(target=rewrite, args=(s,)) for s in versions]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    stop.set()
    reader.join(timeout=10)

    assert failures == []
    assert seen <= {old, *versions.values()}, {len(s) for s in seen}
    assert seen & set(versions.values()), "the reader saw no update"
    assert system_md.read_text() in versions.values()
    for session in versions:
        pairs = calls(site.events("coder", session), "agent.update")
        assert [(e["type"], e["status"]) for e in pairs] == [
            ("tool_call", "ok"),
            ("tool_result", "ok"),
        ] * rounds, pairs
    facts = updates(site, "coder")
    assert sorted(facts) == sorted(
        [("system.md", s, len(v.encode())) for s, v in versions.items()] * rounds
    ), facts
    assert derived(site, "coder") == shown
    assert {c: (site.controls("coder") / c).read_bytes() for c in fixed} == fixed
    refused = site.ctx("run", "--agent", "coder", "shell.exec", '{"cmd": "id"}')
    assert refused.rc == 126, refused


# ---------------------------------------------------------------- a chain of creations


def native_create(site: Site, agent: str, request: dict) -> dict:
    ran = site.ctx("run", "--agent", agent, "--native", "agent.create", input=json.dumps(request))
    frames = [json.loads(line) for line in ran.lines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", ran
    return frames[-1]


def test_each_link_of_a_creation_chain_is_attenuated_by_its_own_creator(site: Site) -> None:
    """A-4, A-3, P-6, P-7, A-5: agent.create is installed (``ctx object list``; agent.start and
    agent.stop are not).  A parent (groups 100, a shared space it reads, a workspace it writes,
    a reference dir) makes a child with part of that; the host grants the child
    ``agent:gc create``; the child's grandchild may have only what the *child* holds — not the
    parent's other tools, mounts or space writes, nor the parent's label — and runs as the
    parent's uid and groups.  Nothing is inherited: neither creation right passes down, each
    log names its creator, and the child's self-update leaves its parent's prompt alone."""
    listed = {o["name"]: o for o in site.ctx("object", "list", "--json").json()}
    assert listed["agent.create"]["status"] == "available", listed.get("agent.create")
    assert listed["agent.update"]["status"] == "available", listed.get("agent.update")
    assert "agent.start" not in listed and "agent.stop" not in listed
    assert not (site.storage / "tool" / "agent.start").exists()
    made = site.ctx("shared", "create", "team", "--group", str(USERS_GID))
    assert made.rc == 0, made

    parent = site.create_agent(
        {
            "name": "parent",
            "label": "parent_t",
            "tools": ["fs.read", "fs.list", "agent.create", "agent.update"],
            "shared": {"team": ["read"]},
            "mount": [[str(site.ws), "/workspace", "rw"], [str(site.ref), "/ref", "ro"]],
        },
        "--groups",
        str(USERS_GID),
    )
    site.allow_tool("parent_t", "fs.read", "fs.list", "agent.create", "agent.update")
    site.grant("parent", "agent:child create")
    parent_prompt = (site.controls("parent") / "system.md").read_bytes()

    child = {
        "name": "child",
        "label": "child_t",
        "tools": ["fs.read", "agent.create", "agent.update"],
        "shared": {"team": ["read"]},
        "mount": [["/workspace", "/workspace", "rw"]],  # named as the parent sees it
    }
    result = native_create(site, "parent", child)
    assert result["status"] == "ok", result
    assert result["output"] == {
        "agent": "child",
        "label": "child_t",
        "uid": parent["identity"]["uid"],
        "warnings": [],
    }
    shown = site.ctx("agent", "show", "child", "--json").json()
    assert shown["identity"] == parent["identity"]
    assert shown["mounts"] == [
        [str(site.ws), "/workspace", "rw"],
        [str(site.storage), "/ctx", "ro"],
    ]

    site.allow_tool("child_t", "fs.read", "agent.create", "agent.update")
    first = native_create(site, "child", {"name": "gc", "label": "gc_t"})
    assert first["output"]["error"] == "EACCES", first  # the parent's right did not pass down
    assert "agent:gc create" in first["output"]["message"], first
    site.grant("child", "agent:gc create")
    for request, missing in (
        ({"tools": ["fs.list"]}, "tool:fs.list execute"),  # the parent's, not the child's
        ({"mount": [["/ref", "/ref", "ro"]]}, "the mount at /ref (ro)"),
        ({"mount": [[str(site.ref), "/ref", "ro"]]}, "the mount at /ref (ro)"),
        ({"shared": {"team": ["read", "write"]}}, "shared:team write"),
        ({"label": "parent_t"}, "label parent_t is agent parent's"),
        ({"name": "gc2", "label": "gc2_t"}, "agent:gc2 create"),
    ):
        refused = native_create(site, "child", {"name": "gc", "label": "gc_t", **request})
        assert refused["output"]["error"] == "EACCES", (request, refused)
        assert missing in refused["output"]["message"], (request, refused)
    assert not (site.storage / "agent" / "gc").exists()
    assert not (site.storage / "agent" / "gc2").exists()

    grandchild = {
        "name": "gc",
        "label": "gc_t",
        "tools": ["fs.read"],
        "shared": {"team": ["read"]},
        "mount": [["/workspace", "/w", "ro"]],
    }
    result = native_create(site, "child", grandchild)
    assert result["status"] == "ok" and result["output"]["uid"] == parent["identity"]["uid"]
    gc = site.ctx("agent", "show", "gc", "--json").json()
    assert gc["identity"] == parent["identity"]  # uid, gid and groups: the parent's, no more
    rules = [
        line
        for line in (site.controls("gc") / "policy").read_text().splitlines()
        if line.startswith("allow")
    ]
    assert sorted(rules) == sorted(
        [
            "allow gc_t tool:fs.read execute",
            "allow gc_t shared:team read",
            "allow gc_t mount:w read",
            "allow gc_t mount:ctx read",
        ]
    )

    site.allow_tool("gc_t", "fs.read")
    read = site.ctx("run", "--agent", "gc", "fs.read", "/w/notes.txt")
    assert (read.rc, read.out) == (0, "notes of the workspace\n"), read
    hidden = site.ctx("run", "--agent", "gc", "fs.read", "/ref/notes.txt")
    assert hidden.rc != 0 and "EACCES" in hidden.err, hidden
    for tool, arg in (("fs.list", "/w"), ("agent.create", '{"name": "g3", "label": "g3_t"}')):
        denied = site.ctx("run", "--agent", "gc", tool, arg)
        assert denied.rc == 126 and "step 5" in denied.err, (tool, denied)

    assert [(e["type"], e.get("parent")) for e in site.log("gc")] == [("agent.created", "child")]
    assert [e.get("child") for e in site.log("child")] == [None, "gc"]
    assert [e.get("child") for e in site.log("parent")] == [None, "child"]

    update = json.dumps({"control": "system.md", "content": "I review what gc reads.\n"})
    own = site.ctx("run", "--agent", "child", "agent.update", update)
    assert (own.rc, own.out) == (0, "system.md of agent child updated\n"), own
    assert (site.controls("child") / "system.md").read_text() == "I review what gc reads.\n"
    assert (site.controls("parent") / "system.md").read_bytes() == parent_prompt
    assert set(os.listdir(site.storage)) == ROOT_ENTRIES
    agents = sorted(n for n in os.listdir(site.storage / "agent") if not n.startswith("."))
    assert agents == sorted(f"{a}{s}" for a in ("parent", "child", "gc") for s in ("", ".d"))
