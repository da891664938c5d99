"""Acceptance tests of SPEC §8 (A-1 … A-5): the agent terminal that ``ctx agent start`` runs
in a sandbox on a PTY ``ctxterm`` owns, its session socket and mode lines, ``ctx agent
watch``/``attach``, the entries ``ctx agent create`` makes, and the two agent lifecycle tools
``agent.create`` (attenuation) and ``agent.update`` (self-iteration).  Black-box: the installed
``ctx``, real processes, PTYs, sockets and uids; ``test_acceptance_agents_edges.py`` holds the
edge cases of the same commands."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, ROOT_ENTRIES, alive, clean_env, ctx_run, wait_for
from tests.support.storage import traversable_tmp as traversable_tmp

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents with other uids need root")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)
pytestmark = needs_root

NOTE = "hello from the host workspace\n"


# ------------------------------------------------------------------ helpers


@pytest.fixture
def root(_template: Path, traversable_tmp: Path) -> Path:
    """A copy of the root ``ctx bootstrap`` made, where an agent's uid may search every parent
    (the agents below run as ``nobody``, and the chain checks Linux mode bits, P-5 step 2)."""
    storage = traversable_tmp / "storage"
    shutil.copytree(_template, storage, symlinks=True)
    return storage


@pytest.fixture
def workspace(traversable_tmp: Path) -> Path:
    """The directory the caller stands in when it starts a terminal (A-1)."""
    ws = traversable_tmp / "ws"
    ws.mkdir(mode=0o755)
    ws.chmod(0o755)
    (ws / "notes.txt").write_text(NOTE)
    (ws / "notes.txt").chmod(0o644)
    return ws


def create_agent(storage: Path, request: dict, *options: str) -> dict:
    r = ctx_run(
        "agent", "create", "-", "--json", *options, "--storage", storage,
        input=json.dumps(request),
    )  # fmt: skip
    assert r.rc == 0, r
    return r.json()


def grant(storage: Path, label: str, *rules: str) -> None:
    """Append ``allow LABEL RULE`` to the agent's own policy (the host owns it)."""
    agent = next(
        d for d in (storage / "agent").iterdir()
        if d.name.endswith(".d") and (d / "label").read_text().strip() == label
    )  # fmt: skip
    with (agent / "policy").open("a") as policy:
        for rule in rules:
            policy.write(f"allow {label} {rule}\n")


def grant_tool(storage: Path, label: str, *tools: str) -> None:
    """P-6: a tool runs only when both the agent's and the tool's own policy allow it."""
    grant(storage, label, *(f"tool:{t} execute" for t in tools))
    for tool in tools:
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")


def run_native(storage: Path, agent: str, tool: str, payload: dict, session: str = "default"):
    """``ctx run --native``: the JSON input on stdin; returns (exit status, result frame)."""
    r = ctx_run(
        "run", "--native", "--agent", agent, "--session", session, "--storage", storage, tool,
        input=json.dumps(payload),
    )  # fmt: skip
    frames = [json.loads(line) for line in r.lines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", r
    return r.rc, frames[-1]


def errno_word(result: dict) -> str | None:
    """The errno word a refused call carries, wherever the runner put it."""
    for holder in (result.get("error"), result.get("output")):
        if isinstance(holder, dict) and isinstance(holder.get("error"), str):
            return holder["error"]
    return None


def events(storage: Path, uid: int, agent: str, session: str) -> list[dict]:
    path = storage / "home" / str(uid) / "agent" / agent / "session" / session / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tool_events(storage: Path, uid: int, agent: str, session: str, tool: str) -> list[str]:
    return [
        e["type"]
        for e in events(storage, uid, agent, session)
        if e.get("object") == f"tool/{tool}" and e["type"] in ("tool_call", "tool_result")
    ]


def results_recorded(storage: Path, uid: int, agent: str, session: str, count: int) -> bool:
    """Whether ``count`` agent.create calls have their tool_result in the session."""
    calls = tool_events(storage, uid, agent, session, "agent.create")
    return calls.count("tool_result") == count


def terminal_socket(storage: Path, uid: int, agent: str, session: str) -> Path:
    """A-2: the terminal socket's place in the storage root."""
    home = storage / "home" / str(uid) / "agent" / agent
    return home / "session" / session / "terminal" / "main.sock"


@contextlib.contextmanager
def terminal(storage: Path, agent: str, cwd: Path, *options: str) -> Iterator[str]:
    """A terminal started with ``ctx agent start`` from ``cwd``; always stopped after."""
    session = f"s{uuid.uuid4().hex[:12]}"
    where = [agent, "--session", session, "--storage", str(storage)]
    started = ctx_run("agent", "start", *where, *options, cwd=cwd)
    assert started.rc == 0, started
    try:
        yield session
    finally:
        ctx_run("agent", "stop", *where)


@contextlib.contextmanager
def client(path: Path, mode: bytes) -> Iterator[socket.socket]:
    """A raw client of the terminal socket that has sent its mode line (A-2)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(mode)
        yield sock


def read_until(sock: socket.socket, marker: bytes, seen: bytes = b"", timeout=20) -> bytes:
    """What ``sock`` relays until ``marker`` is among it (or the time is up)."""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        seen += chunk
    return seen


def processes_in(directory: Path) -> list[int]:
    """The pids whose current directory is ``directory`` (by inode: seen from any namespace)."""
    wanted = directory.stat()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            here = os.stat(f"/proc/{entry}/cwd")
            if (here.st_dev, here.st_ino) == (wanted.st_dev, wanted.st_ino):
                found.append(int(entry))
    return found


def tsh_in(directory: Path) -> int:
    """The pid of the tsh whose current directory is ``directory``."""
    pids: list[int] = []

    def look() -> bool:
        pids[:] = [
            pid for pid in processes_in(directory)
            if b"tsh" in Path(f"/proc/{pid}/cmdline").read_bytes()
            and os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0])
            != b"bwrap"
        ]  # fmt: skip
        return len(pids) == 1

    assert wait_for(look), f"one tsh in {directory} expected, found {pids}"
    return pids[0]


def parent_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1])


def holds_ptmx(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        return any(os.readlink(fd) == "/dev/ptmx" for fd in fds.iterdir())
    return False


# ------------------------------------------------------------------ the sandbox and the PTY


@needs_terminal
def test_a1_start_mounts_the_current_directory_at_workspace_and_starts_there(root, workspace):
    """A-1: "by default the caller's current directory is mounted at /workspace and the
    terminal starts there"."""
    create_agent(root, {"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    grant_tool(root, "coder_t", "fs.read")
    with terminal(root, "coder", workspace) as session:
        pid = tsh_in(workspace)
        assert os.readlink(f"/proc/{pid}/cwd") == "/workspace"
        assert Path(f"/proc/{pid}/root/workspace/notes.txt").read_text() == NOTE
        with client(terminal_socket(root, 65534, "coder", session), b"attach\n") as sock:
            read_until(sock, b"coder$ ")
            sock.sendall(b"fs.read notes.txt\r")
            shown = read_until(sock, NOTE.strip().encode())
        assert NOTE.strip().encode() in shown, shown


@needs_terminal
def test_a1_the_terminal_runs_in_a_sandbox_as_the_agent(root, workspace):
    """A-1: the terminal runs inside a sandbox: tsh has its own mount and pid namespaces and
    the agent's uid, never root's."""
    created = create_agent(root, {"name": "coder", "label": "coder_t"})
    with terminal(root, "coder", workspace):
        pid = tsh_in(workspace)
        for namespace in ("mnt", "pid"):
            assert os.readlink(f"/proc/{pid}/ns/{namespace}") != os.readlink(
                f"/proc/self/ns/{namespace}"
            ), namespace
        ids = {
            line.split(":")[0]: line.split()[1:]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith(("Uid:", "Gid:"))
        }
        assert set(ids["Uid"]) == {str(created["identity"]["uid"])}
        assert set(ids["Gid"]) == {str(created["identity"]["gid"])}


@needs_terminal
def test_a1_ctxterm_owns_the_pty_and_starts_tsh_for_the_terminals_lifetime(root, workspace):
    """A-1: "ctxterm owns the PTY for the agent terminal's lifetime and starts tsh by
    default": tsh's standard streams are one PTY slave, its controlling terminal; the master
    is held by an ancestor of tsh outside the sandbox, which outlives ``ctx agent start`` and
    ends with the terminal."""
    create_agent(root, {"name": "coder", "label": "coder_t"})
    session = f"s{uuid.uuid4().hex[:12]}"
    where = ["coder", "--session", session, "--storage", str(root)]
    started = ctx_run("agent", "start", *where, cwd=workspace)
    assert started.rc == 0, started
    try:
        pid = tsh_in(workspace)
        slaves = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)}
        assert len(slaves) == 1 and re.fullmatch(r"/dev/pts/\d+", slaves.pop())
        tty_nr = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4])
        assert tty_nr != 0, "tsh has no controlling terminal"
        owner, ancestor = None, pid
        while ancestor > 1 and owner is None:
            ancestor = parent_of(ancestor)
            if holds_ptmx(ancestor):
                owner = ancestor
        assert owner is not None, "no ancestor of tsh holds the PTY master"
        assert os.readlink(f"/proc/{owner}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        assert alive(owner)  # the start returned; the PTY owner stays for the terminal
    finally:
        stopped = ctx_run("agent", "stop", *where)
    assert stopped.rc == 0, stopped
    assert wait_for(lambda: not alive(owner) and not alive(pid)), "the terminal outlived its stop"


# ------------------------------------------------------------------ the terminal socket


@needs_terminal
def test_a2_the_terminal_socket_is_in_the_agents_session_directory(root, workspace):
    """A-2: the socket is ``home/<uid>/agent/<agent>/session/<session>/terminal/main.sock``
    (a socket, or a symlink to one), and answers the mode line ``watch``."""
    created = create_agent(root, {"name": "coder", "label": "coder_t"})
    uid = created["identity"]["uid"]
    with terminal(root, "coder", workspace) as session:
        path = terminal_socket(root, uid, "coder", session)
        assert stat.S_ISSOCK(os.stat(path).st_mode), path
        if path.is_symlink():
            assert os.readlink(path).endswith(f"/coder/{session}/main.sock")
        with client(path, b"watch\n") as sock:
            assert b"coder$ " in read_until(sock, b"coder$ ")
    assert not os.path.exists(path)


@needs_terminal
def test_a2_a_symlinked_socket_leads_to_a_place_the_spec_names(root, workspace):
    """A-2: main.sock "MAY be a symlink to /run/user/<uid>/cortexfs/terminal/<agent>/
    <session>/main.sock (older installs: /run/cortexfs/terminal/<uid>/<agent>/<session>/
    main.sock)"."""
    created = create_agent(root, {"name": "coder", "label": "coder_t"})
    uid = created["identity"]["uid"]
    with terminal(root, "coder", workspace) as session:
        path = terminal_socket(root, uid, "coder", session)
        assert path.is_symlink()
        assert os.readlink(path) in (
            f"/run/user/{uid}/cortexfs/terminal/coder/{session}/main.sock",
            f"/run/cortexfs/terminal/{uid}/coder/{session}/main.sock",
        )


@needs_terminal
def test_a2_watch_reads_output_only_and_attach_writes_to_the_pty(root, workspace):
    """A-2: ``watch\\n`` = read PTY output only; ``attach\\n`` = read output and write stdin to
    the PTY.  What a watcher sends is never typed; what an attached client types runs, and the
    watcher sees its output."""
    created = create_agent(
        root, {"name": "coder", "label": "coder_t", "tools": ["fs.read", "fs.list"]}
    )
    uid = created["identity"]["uid"]
    grant_tool(root, "coder_t", "fs.read", "fs.list")
    with terminal(root, "coder", workspace) as session:
        path = terminal_socket(root, uid, "coder", session)
        with client(path, b"watch\n") as watcher, client(path, b"attach\n") as typist:
            read_until(watcher, b"coder$ ")
            read_until(typist, b"coder$ ")
            watcher.sendall(b"fs.read notes.txt\r")
            time.sleep(1)
            typist.sendall(b"fs.list /workspace\r")
            seen = read_until(watcher, b"notes.txt")
            assert b"notes.txt" in seen, seen
            assert b"notes.txt" in read_until(typist, b"notes.txt")
        assert wait_for(
            lambda: "tool_result" in tool_events(root, uid, "coder", session, "fs.list")
        )
        assert tool_events(root, uid, "coder", session, "fs.read") == []
        assert NOTE.strip().encode() not in seen


@needs_terminal
def test_a2_ctx_agent_watch_shows_the_terminal_and_types_nothing(root, workspace):
    """A-2: ``ctx agent watch <agent> --session S`` is the observe-first client: it shows the
    terminal's output, and its standard input never reaches the PTY."""
    created = create_agent(
        root, {"name": "coder", "label": "coder_t", "tools": ["fs.read", "fs.list"]}
    )
    uid = created["identity"]["uid"]
    grant_tool(root, "coder_t", "fs.read", "fs.list")
    with terminal(root, "coder", workspace) as session:
        watch = subprocess.Popen(
            [*CTX_ARGV, "agent", "watch", "coder", "--session", session, "--storage", root],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(),
        )  # fmt: skip
        try:
            watch.stdin.write(b"fs.read notes.txt\r\n")
            watch.stdin.flush()
            time.sleep(1)
            with client(terminal_socket(root, uid, "coder", session), b"attach\n") as typist:
                read_until(typist, b"coder$ ")
                typist.sendall(b"fs.list /workspace\r")
                read_until(typist, b"notes.txt")
            shown, deadline = b"", time.monotonic() + 20
            while b"notes.txt" not in shown and time.monotonic() < deadline:
                if select.select([watch.stdout], [], [], 0.5)[0]:
                    chunk = os.read(watch.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    shown += chunk
        finally:
            watch.kill()
            watch.communicate()
        assert b"coder$ " in shown and b"notes.txt" in shown, shown
        assert tool_events(root, uid, "coder", session, "fs.read") == []


@needs_terminal
def test_a2_ctx_agent_attach_types_into_the_terminal_and_shows_it(root, workspace):
    """A-2: ``ctx agent attach <agent> --session S`` writes its input to the PTY and shows the
    output: the command runs as a tool call of the agent in that session."""
    created = create_agent(root, {"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    uid = created["identity"]["uid"]
    grant_tool(root, "coder_t", "fs.read")
    with terminal(root, "coder", workspace) as session:
        r = ctx_run(
            "agent", "attach", "coder", "--session", session, "--storage", root,
            input="fs.read notes.txt\n",
        )  # fmt: skip
        assert r.rc == 0, r
        assert NOTE.strip() in r.out, r
        assert wait_for(
            lambda: (
                tool_events(root, uid, "coder", session, "fs.read") == ["tool_call", "tool_result"]
            )
        )


# ------------------------------------------------------------------ what create makes


def test_a3_create_makes_an_entry_and_controls_and_no_root_namespace(storage, tmp_path):
    """A-3: a create with every request field makes an ordinary executable ``agent/<name>``
    and ``agent/<name>.d/*`` controls, and no new root namespace (R-2's six entries stay)."""
    source = tmp_path / "src"
    source.mkdir()
    request = {
        "name": "reviewer",
        "label": "reviewer_t",
        "model": ["openai/gpt-5"],
        "tools": ["fs.read", "fs.list"],
        "shared": {"proj": ["read"]},
        "mount": [[str(source), "/data", "ro"]],
    }
    create_agent(storage, request)
    entry = storage / "agent" / "reviewer"
    assert stat.S_ISREG(entry.lstat().st_mode) and os.access(entry, os.X_OK)
    controls = storage / "agent" / "reviewer.d"
    assert controls.is_dir() and not controls.is_symlink()
    for control in ("policy", "system.md", "prompt.template.md"):
        assert (controls / control).is_file(), control
    assert set(os.listdir(storage)) == ROOT_ENTRIES
    policy = controls / "policy"
    for rule in ("tool:fs.read execute", "tool:fs.list execute", "model:openai/gpt-5 use",
                 "shared:proj read"):  # fmt: skip
        query = ["policy", "query", "--policy", policy, "reviewer_t", *rule.split()]
        assert ctx_run(*query).out.strip() == "allow", rule
    for rule in ("tool:shell.exec execute", "shared:proj write"):
        query = ["policy", "query", "--policy", policy, "reviewer_t", *rule.split()]
        assert ctx_run(*query).out.strip() == "deny", rule


INVALID_REQUESTS = [
    {"name": "../evil", "label": "evil_t"},
    {"name": "x.d", "label": "x_t"},
    {"name": "a" * 65, "label": "a_t"},
    {"name": "ok", "label": "ok_t", "tools": "fs.read"},
    {"name": "ok", "label": "ok_t", "mount": [["/tmp", "/data", "rx"]]},
    {"name": "ok", "label": "ok_t", "groups": [0]},
]


def test_a3_an_invalid_request_is_einval_and_creates_nothing(storage):
    """A-3, R-3: the request has the listed fields of the listed shapes; an illegal name or a
    malformed field is EINVAL and nothing appears under agent/ or at the root."""
    for request in INVALID_REQUESTS:
        r = ctx_run("agent", "create", "-", "--storage", storage, input=json.dumps(request))
        assert r.rc != 0, r
        assert "EINVAL" in r.err, r
        assert os.listdir(storage / "agent") == [], request
        assert set(os.listdir(storage)) == ROOT_ENTRIES


# ------------------------------------------------------------------ agent.create attenuates


@pytest.fixture
def parent(root: Path, workspace: Path) -> dict:
    """Agent ``parent`` (label parent_t) that may run agent.create, fs.read and fs.list and
    reads ``workspace`` at /workspace; it holds no ``agent:<child> create`` yet."""
    request = {
        "name": "parent",
        "label": "parent_t",
        "tools": ["fs.read", "fs.list"],
        "mount": [[str(workspace), "/workspace", "ro"]],
    }
    created = create_agent(root, request, "--user", "nobody", "--groups", "100")
    grant_tool(root, "parent_t", "agent.create", "fs.read", "fs.list")
    return created


def child_request(name: str = "review-1", **fields) -> dict:
    request = {"name": name, "label": f"{name.replace('-', '_')}_t", "tools": ["fs.read"]}
    request.update(fields)
    return request


def test_a4_agent_create_needs_create_on_that_very_child_name(root, parent):
    """A-4, P-7: the parent must hold ``agent:<child> create`` for the child's concrete name;
    another name's grant does not do."""
    grant(root, "parent_t", "agent:review-2 create")
    status, result = run_native(root, "parent", "agent.create", child_request())
    assert status != 0 and result["status"] == "error", result
    assert errno_word(result) == "EACCES", result
    assert not (root / "agent" / "review-1").exists()
    assert not (root / "agent" / "review-1.d").exists()
    grant(root, "parent_t", "agent:review-1 create")
    status, result = run_native(root, "parent", "agent.create", child_request())
    assert (status, result["status"]) == (0, "ok"), result
    assert (root / "agent" / "review-1").is_file()
    assert (root / "agent" / "review-1.d" / "policy").is_file()
    assert set(os.listdir(root)) == ROOT_ENTRIES


def test_a4_child_permissions_are_a_subset_of_the_parents(root, parent):
    """A-4: "the child's permissions ⊆ the parent's": asking for one the parent lacks is
    refused and nothing is created."""
    grant(root, "parent_t", "agent:review-1 create")
    for fields in [
        {"tools": ["shell.exec"]},
        {"tools": ["fs.read", "fs.write"]},
        {"model": ["openai/gpt-5"]},
        {"shared": {"proj": ["read"]}},
    ]:
        status, result = run_native(root, "parent", "agent.create", child_request(**fields))
        assert status != 0 and result["status"] == "error", (fields, result)
        assert errno_word(result) == "EACCES", (fields, result)
        assert not (root / "agent" / "review-1.d").exists(), fields


def test_a4_child_mounts_are_within_the_parents_visible_mounts(root, parent, workspace):
    """A-4: "the child's mounts ⊆ the parent's visible mounts"."""
    grant(root, "parent_t", "agent:review-1 create")
    for mount in [
        [str(workspace), "/data", "rw"],  # the parent only reads it
        ["/etc", "/data", "ro"],  # the parent does not see it
        [str(workspace.parent), "/data", "ro"],  # wider than what the parent sees
    ]:
        status, result = run_native(root, "parent", "agent.create", child_request(mount=[mount]))
        assert status != 0 and errno_word(result) == "EACCES", (mount, result)
        assert not (root / "agent" / "review-1.d").exists(), mount
    request = child_request(mount=[[str(workspace), "/data", "ro"]])
    status, result = run_native(root, "parent", "agent.create", request)
    assert (status, result["status"]) == (0, "ok"), result
    assert (root / "agent" / "review-1.d").is_dir()


def test_a4_child_identity_and_groups_are_within_the_parents(root, parent):
    """A-4: "the child's groups ⊆ the parent's"; the request cannot name others."""
    grant(root, "parent_t", "agent:review-1 create")
    status, result = run_native(root, "parent", "agent.create", child_request())
    assert status == 0, result
    shown = ctx_run("agent", "show", "review-1", "--json", "--storage", root)
    assert shown.rc == 0, shown
    child, mother = shown.json()["identity"], parent["identity"]
    assert child["uid"] == mother["uid"]
    assert {child["gid"], *child["groups"]} <= {mother["gid"], *mother["groups"]}
    status, result = run_native(
        root, "parent", "agent.create", child_request("review-2", groups=[0])
    )
    assert status != 0 and result["status"] == "error", result
    assert not (root / "agent" / "review-2.d").exists()


def test_a4_an_illegal_child_name_is_refused(root, parent):
    """A-4, R-3: "the child's name is legal"; anything else is EINVAL."""
    grant(root, "parent_t", "agent:review-1 create")
    before = sorted(os.listdir(root / "agent"))
    for name in ["../evil", "child.d", ".hidden", "a/b", "x" * 65]:
        status, result = run_native(root, "parent", "agent.create", child_request(name))
        assert status != 0 and errno_word(result) == "EINVAL", (name, result)
        assert sorted(os.listdir(root / "agent")) == before, name
        assert set(os.listdir(root)) == ROOT_ENTRIES


def test_a4_a_child_inherits_nothing_it_was_not_granted(root, parent):
    """A-4: "Grants are explicit and per child name; nothing is inherited by default": the
    child holds what the request named and not the parent's other grants."""
    grant(root, "parent_t", "agent:review-1 create")
    status, result = run_native(root, "parent", "agent.create", child_request())
    assert status == 0, result
    policy = root / "agent" / "review-1.d" / "policy"
    for rule, expected in [
        ("tool:fs.read execute", "allow"),
        ("tool:fs.list execute", "deny"),
        ("tool:agent.create execute", "deny"),
        ("agent:review-1 create", "deny"),
        ("mount:workspace read", "deny"),
    ]:
        query = ctx_run("policy", "query", "--policy", policy, "review_1_t", *rule.split())
        assert query.out.strip() == expected, (rule, query)


@needs_terminal
def test_a4_agent_create_from_the_parents_terminal(root, parent, workspace):
    """A-4: typed in the parent's terminal, agent.create makes the child the parent may make,
    with the parent's identity, and refuses one it may not."""
    grant(root, "parent_t", "agent:review-1 create")
    uid = parent["identity"]["uid"]
    with (
        terminal(root, "parent", workspace) as session,
        client(terminal_socket(root, uid, "parent", session), b"attach\n") as typist,
    ):
        read_until(typist, b"parent$ ")
        for done, name in enumerate(("review-9", "review-1"), start=1):
            typist.sendall(f"agent.create '{json.dumps(child_request(name))}'\r".encode())
            assert wait_for(partial(results_recorded, root, uid, "parent", session, done)), name
    assert not (root / "agent" / "review-9.d").exists()
    assert (root / "agent" / "review-1.d" / "policy").is_file()
    shown = ctx_run("agent", "show", "review-1", "--json", "--storage", root)
    assert shown.json()["identity"]["uid"] == uid, shown


def test_a4_lifecycle_tools_that_exist_are_whole_tools(root):
    """A-4, R-5: agent.create, agent.start and agent.stop exist only where implemented: each
    one bootstrap installs is an executable tool with its control directory (T-1)."""
    for name in ("agent.create", "agent.start", "agent.stop"):
        tool = root / "tool" / name
        if tool.exists() or tool.is_symlink():
            assert tool.is_file() and os.access(tool, os.X_OK), name
            for control in ("name", "description", "schema", "policy", "status"):
                assert (root / "tool" / f"{name}.d" / control).is_file(), (name, control)


# ------------------------------------------------------------------ agent.update


@pytest.fixture
def updater(root: Path) -> dict:
    """Agents ``coder`` (allowed agent.update in both policies) and ``other``."""
    coder = create_agent(root, {"name": "coder", "label": "coder_t"})
    create_agent(root, {"name": "other", "label": "other_t"})
    grant_tool(root, "coder_t", "agent.update")
    return coder


def controls_of(root: Path, agent: str) -> dict[str, bytes]:
    folder = root / "agent" / f"{agent}.d"
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "log"}


@pytest.mark.parametrize("control", ["system.md", "prompt.template.md"])
def test_a5_agent_update_replaces_its_own_prompt_control(root, updater, control):
    """A-5: the caller's own system.md or prompt.template.md is replaced atomically (a new
    file renamed over the old: the old inode is never rewritten in place), and the call is
    recorded as ordinary tool_call/tool_result events."""
    target = root / "agent" / "coder.d" / control
    before = target.stat().st_ino
    other = controls_of(root, "other")
    content = "Answer in one short paragraph.\n"
    status, result = run_native(
        root, "coder", "agent.update", {"control": control, "content": content}, session="s1"
    )
    assert (status, result["status"]) == (0, "ok"), result
    assert target.read_text() == content
    assert target.stat().st_ino != before
    assert controls_of(root, "other") == other
    uid = updater["identity"]["uid"]
    assert tool_events(root, uid, "coder", "s1", "agent.update") == ["tool_call", "tool_result"]


def test_a5_any_other_control_is_einval(root, updater):
    """A-5: "Any other control (policy, mount, model, window, identity files) → EINVAL"."""
    before = controls_of(root, "coder")
    for control in ["policy", "mount", "model", "window", "identity", "label", "log",
                    "../coder.d/system.md", "system.md/", "SYSTEM.md"]:  # fmt: skip
        payload = {"control": control, "content": "allow coder_t tool:shell.exec execute\n"}
        status, result = run_native(root, "coder", "agent.update", payload)
        assert status != 0 and errno_word(result) == "EINVAL", (control, result)
        assert controls_of(root, "coder") == before, control


def test_a5_a_payload_over_8_kib_is_rejected(root, updater):
    """A-5: the host "rejects payloads over 8 KiB" (8192 bytes; "€" is three bytes of UTF-8)."""
    before = controls_of(root, "coder")
    for content in ["a" * 8193, "€" * 2800, "a" * 20000]:
        payload = {"control": "system.md", "content": content}
        status, result = run_native(root, "coder", "agent.update", payload)
        assert status != 0 and result["status"] == "error", (len(content), result)
        assert controls_of(root, "coder") == before


def test_a5_a_small_payload_is_accepted_whole(root, updater):
    content = "ok €\n" * 1000  # 7000 bytes
    status, result = run_native(
        root, "coder", "agent.update", {"control": "system.md", "content": content}
    )
    assert (status, result["status"]) == (0, "ok"), result
    assert (root / "agent" / "coder.d" / "system.md").read_text() == content


@pytest.mark.parametrize("layer", ["agent", "tool"])
def test_a5_agent_update_needs_both_policies(root, layer):
    """A-5: it "needs allow <agent>_t tool:agent.update execute in both the agent and the
    tool policy"."""
    create_agent(root, {"name": "coder", "label": "coder_t"})
    if layer == "agent":
        grant(root, "coder_t", "tool:agent.update execute")
    else:
        with (root / "tool" / "agent.update.d" / "policy").open("a") as policy:
            policy.write("allow coder_t tool:agent.update execute\n")
    before = controls_of(root, "coder")
    payload = {"control": "system.md", "content": "x\n"}
    status, result = run_native(root, "coder", "agent.update", payload)
    assert status != 0 and errno_word(result) == "EACCES", result
    assert controls_of(root, "coder") == before


def test_a5_an_agent_cannot_rewrite_another_agent(root, updater):
    """A-5: the host binds the request to the caller's agent: a request that names another
    agent changes nothing of it, and the tool run outside the runner (no capability) is
    refused."""
    other = controls_of(root, "other")
    payload = {"control": "system.md", "content": "rewritten\n", "agent": "other"}
    status, result = run_native(root, "coder", "agent.update", payload)
    assert status != 0 and result["status"] == "error", result
    tool = root / "tool" / "agent.update"
    for argv in ([str(tool), json.dumps({"control": "system.md", "content": "rewritten\n"})],):
        direct = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
            env=clean_env(CTX_STORAGE=str(root), CTX_AGENT="other", CTX_SESSION="default"),
        )  # fmt: skip
        assert direct.returncode != 0, direct
    assert controls_of(root, "other") == other
    assert b"rewritten" not in (root / "agent" / "coder.d" / "system.md").read_bytes()


@needs_terminal
def test_a5_agent_update_from_the_agents_terminal(root, updater, workspace):
    """A-5: typed in the agent's own terminal, agent.update goes to the host over the run
    capability and replaces that agent's system.md, recorded in the terminal's session."""
    uid = updater["identity"]["uid"]
    with terminal(root, "coder", workspace) as session:
        line = 'agent.update \'{"control": "system.md", "content": "From the terminal."}\'\r'
        with client(terminal_socket(root, uid, "coder", session), b"attach\n") as typist:
            read_until(typist, b"coder$ ")
            typist.sendall(line.encode())
            assert wait_for(
                lambda: "tool_result" in tool_events(root, uid, "coder", session, "agent.update")
            )
    assert (root / "agent" / "coder.d" / "system.md").read_text() == "From the terminal."
