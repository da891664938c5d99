"""Agents and their terminal socket, shared spaces, MCP projection, the reserved programmatic
tool calling, the manual bundle, mounting /ctx and one queue for several machines (SPEC §0,
§1, §8–§14), checked against the sentences of the specification alone: the storage root and
its six entries, object names, what ``ctx agent create`` leaves, ``ctx agent start`` and the
A-2 socket (its path, the ``watch``/``attach`` mode lines, ``ctx agent watch|attach``), the
attenuation of ``agent.create`` and the limits of ``agent.update``, the Linux permissions of a
shared space and what an agent's view shows of it, ``ctxmcp list|project`` against a real MCP
server and a small stdio one (versions, names, the locator, no secrets copied), the
``program`` control, ``ctx man`` and the bundle, ``ctx mount [--as]`` and ``ctx umount``, and
lease liveness across hosts.  Every expectation names the requirement it comes from."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    kill_processes_of,
    mounted_at,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.users import access_as, members_of, run_as
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
BIN = Path(CTX_ARGV[0]).parent
REPO = BIN.parents[1]
CTXMCP = [str(BIN / "ctxmcp")]
TIME_SERVER = BIN / "mcp-server-time"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else str(BIN / "python")
WAIT = 30.0  # seconds: the bound of every poll

ROOT_ENTRIES = {"bin", "tool", "agent", "model", "home", "shared"}
QUEUE_DIRS = {"inbox", "pending", "lease", "claimed", "done", "failed"}
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
T1_CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log")
MAN_PAGES = {
    "agent": "ctx.agent.md",
    "tool": "ctx.tool.md",
    "model": "ctx.model.md",
    "coreutils": "ctx.coreutils.md",
    "root-abi": "ctx.root-abi.md",
    "session": "ctx.session.md",
    "provider": "ctx.provider.md",
}
STABLE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
ILLEGAL_NAMES = ("..", "a/b", "tool.d", "a" * 65)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (agents, other uids)")
needs_fuse = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
)
needs_time_server = pytest.mark.skipif(
    not TIME_SERVER.exists(), reason="the mcp-server-time package is not installed"
)

# A small MCP stdio server (JSON-RPC, one message a line), standard library only.  Its
# behaviour comes from the JSON file named by its first argument: the protocol version it
# answers, the tools it lists, and a file where it notes what it was sent (when it may).
MCP_SERVER = r"""
import json
import sys

with open(sys.argv[1]) as spec_file:
    spec = json.load(spec_file)


def note(message):
    try:
        with open(spec["log"], "a") as log:
            log.write(json.dumps(message) + "\n")
    except (KeyError, OSError):
        pass


for line in sys.stdin:
    if not line.strip():
        continue
    message = json.loads(line)
    note(message)
    if "id" not in message:
        continue
    method = message.get("method")
    if method == "initialize":
        result = {
            "protocolVersion": spec["version"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "spec-server", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": spec["tools"]}
    elif method == "tools/call":
        text = json.dumps(message["params"])
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        error = {"code": -32601, "message": "unknown method"}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""

# A tool that says as which uid it runs.
PROBE = '#!/bin/sh\necho "probe-uid=$(id -u)"\n'


# ------------------------------------------------------------------------------ helpers


def ctxmcp(*args: str | os.PathLike, env: dict[str, str] | None = None) -> Run:
    """``ctxmcp ARGS...`` in a subprocess."""
    argv = [*CTXMCP, *map(str, args)]
    done = subprocess.run(argv, input=b"", capture_output=True, env=env or clean_env(), timeout=120)
    return Run(
        argv,
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def remote_tool(name: str) -> dict:
    """One entry of an MCP ``tools/list`` answer."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return {"name": name, "description": f"Remote tool {name}.", "inputSchema": schema}


@dataclass
class McpServer:
    """The small stdio server of :data:`MCP_SERVER`, set up in a directory of its own with
    an MCP client configuration ``mcp.json`` naming it as server ``name``."""

    dir: Path
    name: str

    @property
    def config(self) -> Path:
        return self.dir / "mcp.json"

    def received(self) -> list[dict]:
        return read_jsonl(self.dir / "log.jsonl")


def mcp_server(
    top: Path,
    tools: list[dict],
    version="2025-11-25",
    name: str = "demo",
    secret_env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> McpServer:
    """A :class:`McpServer` below ``top`` that answers ``version`` and lists ``tools``."""
    where = top / f"mcp-{uuid.uuid4().hex[:8]}"
    where.mkdir(mode=0o755)
    where.chmod(0o755)
    (where / "server.py").write_text(MCP_SERVER)
    spec = {"log": str(where / "log.jsonl"), "version": version, "tools": tools}
    (where / "spec.json").write_text(json.dumps(spec))
    entry: dict = {
        "command": PYTHON,
        "args": [str(where / "server.py"), str(where / "spec.json"), *extra_args],
    }
    if secret_env:
        entry["env"] = secret_env
    (where / "mcp.json").write_text(json.dumps({"mcpServers": {name: entry}}))
    for made in where.iterdir():
        made.chmod(0o644)
    return McpServer(where, name)


def paths_under(top: Path) -> set[str]:
    """Every path below ``top``, links not followed."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            found.add(str(Path(dirpath, name).relative_to(top)))
    return found


def connect(sock: socket.socket, path: Path) -> None:
    """Connect to the socket at ``path``, through its open directory when the path is longer
    than a UNIX socket address holds."""
    if len(os.fsencode(path)) <= 100:
        sock.connect(str(path))
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{directory}/{path.name}")
    finally:
        os.close(directory)


class Client:
    """A client of a terminal socket (A-2): it sends ``first`` (a mode line and maybe more),
    then collects what the terminal relays."""

    def __init__(self, path: Path, first: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connect(self.sock, path)
        self.sock.sendall(first)
        self.data = b""
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            self.data += chunk

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shows(self, text: str) -> bool:
        return wait_for(lambda: text.encode() in self.data, WAIT)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.reader.join(timeout=5)


@contextlib.contextmanager
def clients() -> Iterator[list[Client]]:
    opened: list[Client] = []
    try:
        yield opened
    finally:
        for client in reversed(opened):
            client.close()


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped storage root (a copy of one) in a scratch directory every uid may
    search."""

    top: Path
    storage: Path

    def agent(self, request_: dict, *options: str) -> dict:
        return self.create_agent(request_, *options)

    @staticmethod
    def policy_allows(policy: Path, subject: str, obj: str, perm: str) -> bool:
        """Whether the policy file holds ``allow SUBJECT OBJ PERM`` (P-1: one rule a line,
        blank and ``#`` lines ignored; P-2: default deny, no glob, no inheritance)."""
        rules = set()
        for line in policy.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                rules.add(tuple(line.split()))
        return ("allow", subject, obj, perm) in rules

    def run(self, agent: str, tool: str, *args: str, **kw) -> Run:
        return self.ctx("run", "--agent", agent, tool, *args, **kw)


@pytest.fixture(scope="session")
def template() -> Iterator[Path]:
    """One storage root made by ``ctx bootstrap`` per test process, copied for each test."""
    top = new_scratch_dir(TOP, "template-")
    root = top / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    yield root
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP)
    storage = top / "storage"
    shutil.copytree(template, storage, symlinks=True)
    try:
        yield World(top, storage)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", point], check=False)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def mount(
    world: OnStorage, where: Path, *args: str, wrap: tuple[str, ...] = ()
) -> Iterator[subprocess.Popen]:
    """``ctx mount WHERE ARGS`` (F-1's order: the mount point, then ``--as AGENT``) on the
    world's storage root (run under ``wrap``, a tracer say), running until the block ends;
    then ``ctx umount WHERE``."""
    where.mkdir(exist_ok=True)
    log = where.with_name(where.name + ".stderr")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*wrap, *CTX_ARGV, "mount", str(where), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=world.env,
            start_new_session=True,
        )
    try:
        up = wait_for(lambda: mounted_at(where) or proc.poll() is not None, WAIT)
        assert up and proc.poll() is None, f"ctx mount: {log.read_text()}"
        yield proc
    finally:
        if mounted_at(where):
            ctx_run("umount", where, timeout=WAIT)
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_denied(path: Path) -> int | None:
    """The errno of an attempt to create or append to ``path``; None when it succeeded."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as refused:
        return refused.errno
    os.close(fd)
    return None


# ====================================================================== §1 storage root


def test_bootstrap_makes_exactly_the_six_root_entries(template: Path) -> None:
    """R-2, R-5: ``ctx bootstrap`` creates the root ABI directories, and the root holds exactly
    ``bin/ tool/ agent/ model/ home/ shared/``: nothing else, not even a hidden entry."""
    assert set(os.listdir(template)) == ROOT_ENTRIES
    for entry in ROOT_ENTRIES:
        assert (template / entry).is_dir() and not (template / entry).is_symlink(), entry


def test_bootstrap_installs_the_core_tools_tsh_config_and_bundle(template: Path) -> None:
    """R-5, T-1: the core tools ``fs.read fs.list fs.stat fs.write shell.exec tsh.config``
    (each an executable ``tool/<name>`` with its ``tool/<name>.d/`` and the T-1 controls),
    ``tool/tsh.d/config`` and the docs bundle ``shared/cortexfs-docs/``."""
    for name in CORE_TOOLS:
        executable = template / "tool" / name
        assert executable.is_file() and executable.stat().st_mode & 0o111, name
        controls = template / "tool" / f"{name}.d"
        for control in T1_CONTROLS:
            assert (controls / control).is_file(), (name, control)
        assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
    assert (template / "tool" / "tsh.d" / "config").is_file()
    assert (template / "shared" / "cortexfs-docs" / "README.md").is_file()


@needs_root
def test_bootstrap_repairs_keeps_user_data_and_is_idempotent(world: World) -> None:
    """R-5, D-1: ``ctx bootstrap`` rebuilds a stale bundle (a page changed, a page missing)
    and never destroys user data (a rule an administrator added, a comment in tsh's
    configuration, an agent, a file in a space); run again, as ``ctx bootstrap SOURCE``
    from the source tree, it changes nothing at all."""
    pages = world.storage / "shared" / "cortexfs-docs" / "man"
    (pages / "ctx.agent.md").chmod(0o644)
    (pages / "ctx.agent.md").write_text("stale\n")
    (pages / "ctx.model.md").unlink()
    rule = "allow coder_t tool:fs.read execute\n"
    with (world.storage / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write(rule)
    with (world.storage / "tool" / "tsh.d" / "config").open("a") as config:
        config.write("# kept by the administrator\n")
    world.agent({"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    notes = world.storage / "shared" / "keep" / "data" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("user data\n")
    first = world.ctx("bootstrap")
    assert first.rc == 0, first
    for page in ("ctx.agent.md", "ctx.model.md"):
        assert (pages / page).read_bytes() == (REPO / "docs" / "spec" / page).read_bytes()
    after_first = snapshot(world.storage)
    second = world.ctx("bootstrap", REPO)
    assert second.rc == 0, second
    assert snapshot(world.storage) == after_first
    assert rule in (world.storage / "tool" / "fs.read.d" / "policy").read_text()
    assert "# kept by the administrator" in (world.storage / "tool/tsh.d/config").read_text()
    assert notes.read_text() == "user data\n"
    assert (world.storage / "agent" / "coder").is_file()
    assert (world.storage / "agent" / "coder.d" / "policy").is_file()


@needs_root
def test_default_storage_root_of_a_user(world: World, unprivileged_user) -> None:
    """R-1: for a non-root user with no configuration the storage root is
    ``$XDG_DATA_HOME/cortexfs/storage/current``, ``~/.local/share/...`` when
    ``XDG_DATA_HOME`` is unset."""
    user = unprivileged_user
    home = world.top / "user-home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}

    runs = [
        subprocess.Popen(
            [*CTX_ARGV, "bootstrap"],
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            env={**base, **extra},
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for extra in ({"XDG_DATA_HOME": str(home / "xdg")}, {})
    ]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    assert set(os.listdir(home / "xdg" / "cortexfs" / "storage" / "current")) == ROOT_ENTRIES
    local = home / ".local" / "share" / "cortexfs" / "storage" / "current"
    assert set(os.listdir(local)) == ROOT_ENTRIES


@needs_root
def test_illegal_agent_names_are_einval(world: World) -> None:
    """R-3, A-3: an agent name is 1 to 64 bytes of ``[A-Za-z0-9._-]``, first byte
    alphanumeric, not ``.``/``..``, no ``/``, no NUL, not ending in ``.d``; anything else is
    rejected with EINVAL and nothing is made.  64 bytes are accepted."""
    before = set(os.listdir(world.storage / "agent"))
    for name in (*ILLEGAL_NAMES, "", "nul\x00x"):
        made = world.ctx(
            "agent", "create", "-", input=json.dumps({"name": name, "label": "coder_t"})
        )
        assert made.rc != 0 and "EINVAL" in made.err, (name, made)
        assert set(os.listdir(world.storage / "agent")) == before, name
    longest = "a" * 64
    world.agent({"name": longest, "label": "coder_t"})
    assert (world.storage / "agent" / longest).is_file()


@needs_root
def test_illegal_shared_space_names_are_einval(world: World) -> None:
    """R-3, X-1: a shared space name is an object name; anything else is EINVAL and no
    space is made; 64 bytes are accepted (``ctx shared create NAME``, README)."""
    before = set(os.listdir(world.storage / "shared"))
    for name in ILLEGAL_NAMES:
        made = world.ctx("shared", "create", name)
        assert made.rc != 0 and "EINVAL" in made.err, (name, made)
        assert set(os.listdir(world.storage / "shared")) == before, name
    made = world.ctx("shared", "create", "b" * 64)
    assert made.rc == 0, made
    assert (world.storage / "shared" / ("b" * 64) / "data").is_dir()


@needs_root
def test_model_names_are_provider_slash_model(world: World) -> None:
    """R-3, A-3: model names are ``<provider>/<model>``, each part an object name; anything
    else in a request's ``model`` list is EINVAL and no agent is made."""
    for index, model in enumerate(("gpt-5", "a/b/c")):
        name = f"m{index}"
        made = world.ctx(
            "agent",
            "create",
            "-",
            input=json.dumps({"name": name, "label": "m_t", "model": [model]}),
        )
        assert made.rc != 0 and "EINVAL" in made.err, (model, made)
        assert not (world.storage / "agent" / name).exists(), model
    world.agent({"name": "good", "label": "m_t", "model": ["openai/gpt-5.6"]})


# ====================================================================== §8 agents


@needs_root
def test_agent_create_makes_an_entry_and_controls_and_no_root_namespace(world: World) -> None:
    """A-3, P-6, S-6, R-2: the request of the original text makes an executable
    ``agent/<name>`` and ``agent/<name>.d/`` controls, no new root entry, no
    ``agent/<name>.d/tool`` and no ``agent/<name>.d/shared``; its policy allows the listed
    tool and shared permission, nothing else."""
    assert world.ctx("shared", "create", "project-a").rc == 0
    work = world.top / "work"
    work.mkdir()
    world.agent(
        {
            "name": "reviewer",
            "label": "reviewer_t",
            "model": ["openai/gpt-5.6"],
            "tools": ["fs.read"],
            "shared": {"project-a": ["read"]},
            "mount": [[str(work), "/work", "ro"]],
        }
    )
    entry = world.storage / "agent" / "reviewer"
    assert entry.is_file() and not entry.is_symlink() and entry.stat().st_mode & 0o111
    controls = world.storage / "agent" / "reviewer.d"
    assert controls.is_dir()
    assert not (controls / "tool").exists() and not (controls / "shared").exists()
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES
    policy = controls / "policy"
    assert world.policy_allows(policy, "reviewer_t", "tool:fs.read", "execute")
    assert not world.policy_allows(policy, "reviewer_t", "tool:fs.write", "execute")
    assert world.policy_allows(policy, "reviewer_t", "shared:project-a", "read")
    assert not world.policy_allows(policy, "reviewer_t", "shared:project-a", "write")


@needs_root
def test_agent_controls_are_host_owned(world: World, unprivileged_user) -> None:
    """§0, A-3, A-5: agents have host-owned controls: neither the entry ``agent/<name>`` nor
    ``agent/<name>.d/`` nor any control in it is writable by the agent's own uid."""
    world.agent(
        {"name": "coder", "label": "coder_t", "tools": ["fs.read"]},
        "--user",
        unprivileged_user.name,
    )
    controls = world.storage / "agent" / "coder.d"
    paths = [world.storage / "agent", world.storage / "agent" / "coder", controls]
    paths += sorted(controls.iterdir())
    writable = access_as(
        unprivileged_user, [(str(p), "w") for p in paths], unprivileged_user.groups
    )
    assert not any(writable), [p for p, w in zip(paths, writable, strict=True) if w]


@needs_root
def test_agent_request_outside_its_contract_is_refused(world: World) -> None:
    """A-3, P-3: a mount entry is ``[source, target, "ro"|"rw"]`` and a shared space's
    permissions are ``read``/``write``; a request with another mode, a short mount entry or
    another permission makes no agent."""
    work = world.top / "work"
    work.mkdir()
    bad = [
        {"mount": [[str(work), "/work", "rx"]]},
        {"mount": [[str(work), "/work"]]},
        {"shared": {"proj": ["execute"]}},
    ]
    assert world.ctx("shared", "create", "proj").rc == 0
    for index, extra in enumerate(bad):
        name = f"bad{index}"
        made = world.ctx(
            "agent", "create", "-", input=json.dumps({"name": name, "label": "b_t", **extra})
        )
        assert made.rc != 0, (extra, made)
        if "shared" in extra:  # P-3: a permission outside the table is EINVAL
            assert "EINVAL" in made.err, made
        assert not (world.storage / "agent" / name).exists()
        assert not (world.storage / "agent" / f"{name}.d").exists()


@needs_root
def test_agent_mount_under_ctx_is_refused(world: World) -> None:
    """A-3, R-2: a create MUST NOT make a new root namespace: a mount whose target lies in
    /ctx (``/ctx/mcp``, ``//ctx/audit``) would add one to the agent's /ctx, and is refused;
    no agent is made."""
    source = world.top / "github"
    source.mkdir()
    for index, target in enumerate(("/ctx/mcp", "//ctx/audit")):
        name = f"mt{index}"
        request_ = {"name": name, "label": "mt_t", "mount": [[str(source), target, "ro"]]}
        made = world.ctx("agent", "create", "-", input=json.dumps(request_))
        assert made.rc != 0, (target, made)
        assert not (world.storage / "agent" / name).exists(), target


# ---------------------------------------------------------------- the agent terminal


@dataclass(repr=False)
class TermHost(OnStorage):
    """A storage root with agent ``coder`` whose terminal ``ctx agent start`` started from
    the workspace ``ws`` (which holds ``marker.txt``)."""

    top: Path
    storage: Path
    ws: Path
    uid: int
    session: str

    @property
    def session_dir(self) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" / self.session

    @property
    def link(self) -> Path:
        return self.session_dir / "terminal" / "main.sock"

    def events(self, kind: str) -> list[dict]:
        return [e for e in read_jsonl(self.session_dir / "events.jsonl") if e["type"] == kind]

    def attach(self, opened: list[Client], first: bytes = b"attach\n") -> Client:
        client = Client(self.link, first)
        opened.append(client)
        return client

    def idle(self, calls: int = 0) -> bool:
        """Whether at least ``calls`` calls were recorded and each has its result (tsh runs
        one call at a time), within the bound."""

        def done() -> bool:
            made = len(self.events("tool_call"))
            return made >= calls and len(self.events("tool_result")) == made

        return wait_for(done, WAIT)

    def settle(self, client: Client) -> None:
        """Type a call through ``client`` and wait until it has its result: what was typed
        before has been read by the terminal by then."""
        calls = len(self.events("tool_call"))
        token = f"settle-{uuid.uuid4().hex[:8]}"
        client.send(f"fs.stat /workspace/{token}\r".encode())
        assert client.shows(token)
        assert self.idle(calls + 1), client.data


@pytest.fixture(scope="module")
def term(template: Path) -> Iterator[TermHost]:
    """Agent ``coder`` (tools fs.stat and probe, granted on both sides), its terminal
    started by ``ctx agent start coder`` run in the workspace."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("bwrap") is None:
        pytest.skip("ctx agent start needs root, /dev/fuse and bubblewrap")
    top = new_scratch_dir(TOP, "term-")
    storage = top / "storage"
    env = clean_env(CTX_STORAGE=str(storage))
    session = ""
    try:
        shutil.copytree(template, storage, symlinks=True)
        probe = tool_manifest(top / "manifests", "probe", PROBE)
        assert ctx_run("object", "install", probe, "--tier", "system", env=env).rc == 0
        created = ctx_run(
            "agent",
            "create",
            "-",
            "--json",
            input=json.dumps({"name": "coder", "label": "coder_t", "tools": ["fs.stat", "probe"]}),
            env=env,
        )
        assert created.rc == 0, created
        uid = created.json()["identity"]["uid"]
        for tool in ("fs.stat", "probe"):
            with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow coder_t tool:{tool} execute\n")
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        (ws / "marker.txt").write_text("marker\n")
        (ws / "marker.txt").chmod(0o644)
        os.chown(ws, uid, -1)
        # A session name of its own: the run directories of A-2 are named by uid, agent and
        # session only, which another storage root on this machine may use at the same time.
        name = f"s{uuid.uuid4().hex[:10]}"
        started = ctx_run("agent", "start", "coder", "--session", name, env=env, cwd=ws)
        assert started.rc == 0, started
        session = name
        yield TermHost(top, storage, ws, uid, session)
    finally:
        if session:
            ctx_run("agent", "stop", "coder", "--session", session, env=env, timeout=WAIT)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def test_terminal_socket_lies_at_the_a2_path(term: TermHost) -> None:
    """A-2, A-3, R-2: the terminal socket is
    ``home/<uid>/agent/<agent>/session/<session>/terminal/main.sock``, a socket or a symlink
    to ``/run/user/<uid>/cortexfs/terminal/<agent>/<session>/main.sock`` (older installs:
    ``/run/cortexfs/terminal/<uid>/<agent>/<session>/main.sock``); no new root entry."""
    entry = os.lstat(term.link)
    if stat.S_ISLNK(entry.st_mode):
        allowed = {
            f"/run/user/{term.uid}/cortexfs/terminal/coder/{term.session}/main.sock",
            f"/run/cortexfs/terminal/{term.uid}/coder/{term.session}/main.sock",
        }
        assert os.readlink(term.link) in allowed
    else:
        assert stat.S_ISSOCK(entry.st_mode)
    assert stat.S_ISSOCK(os.stat(term.link).st_mode)
    assert set(os.listdir(term.storage)) == ROOT_ENTRIES


def test_terminal_starts_in_the_callers_directory_mounted_at_workspace(term: TermHost) -> None:
    """A-1: by default the caller's current directory is mounted at ``/workspace`` and the
    terminal starts there: ``fs.stat /workspace/marker.txt`` and ``fs.stat marker.txt``
    both find the file of the caller's directory; a name it does not hold is not found."""
    with clients() as opened:
        client = term.attach(opened)
        for line, ok in (
            ("fs.stat /workspace/marker.txt", True),
            ("fs.stat marker.txt", True),
            (f"fs.stat absent-{uuid.uuid4().hex[:6]}.txt", False),
        ):
            assert term.idle()
            calls = len(term.events("tool_call"))
            client.send(line.encode() + b"\r")
            assert term.idle(calls + 1), line
            assert (term.events("tool_result")[-1]["status"] == "ok") is ok, line


def test_tools_of_the_terminal_run_as_the_agents_uid(term: TermHost) -> None:
    """A-1, P-5 (step 1): the terminal runs in a sandbox as the agent: a tool it runs has
    the agent's uid, not root's."""
    with clients() as opened:
        client = term.attach(opened)
        client.send(b"probe\r")
        assert client.shows(f"probe-uid={term.uid}"), client.data
        assert b"probe-uid=0\r" not in client.data


def test_watch_client_sees_output_and_never_types(term: TermHost) -> None:
    """A-2: after the mode line ``watch\\n`` a client reads the PTY's output only; what it
    sends never reaches the PTY, while an ``attach\\n`` client's bytes do."""
    token = uuid.uuid4().hex[:8]
    assert term.idle()
    with clients() as opened:
        watcher = term.attach(opened, b"watch\n")
        watcher.send(f"fs.stat /workspace/watched-{token}\r".encode())
        attacher = term.attach(opened)
        calls = len(term.events("tool_call"))
        attacher.send(f"fs.stat /workspace/attached-{token}\r".encode())
        assert attacher.shows(f"attached-{token}")
        assert term.idle(calls + 1)
        term.settle(attacher)
        assert watcher.shows(f"attached-{token}"), watcher.data
        assert len(term.events("tool_call")) == calls + 2
        assert f"watched-{token}".encode() not in attacher.data + watcher.data


def test_attach_mode_line_and_input_in_one_write(term: TermHost) -> None:
    """A-2: the client sends one mode line, then raw bytes flow: ``attach\\n`` followed in
    the same write by a command line types that command into the PTY."""
    token = uuid.uuid4().hex[:8]
    assert term.idle()
    calls = len(term.events("tool_call"))
    with clients() as opened:
        client = term.attach(opened, f"attach\nfs.stat /workspace/once-{token}\r".encode())
        assert client.shows(f"once-{token}")
        assert term.idle(calls + 1)


def test_ctx_agent_watch_shows_output_and_sends_nothing(term: TermHost) -> None:
    """A-2: ``ctx agent watch <agent> --session S`` (the observe-first default) shows the
    terminal's output and writes nothing into it, whatever its standard input holds."""
    token = uuid.uuid4().hex[:8]
    watch = subprocess.Popen(
        [*CTX_ARGV, "agent", "watch", "coder", "--session", term.session],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=term.env,
    )
    seen = bytearray()
    reader = threading.Thread(
        target=lambda: [seen.extend(chunk) for chunk in iter(lambda: watch.stdout.read1(), b"")],
        daemon=True,
    )
    reader.start()
    try:
        with contextlib.suppress(OSError):
            watch.stdin.write(f"fs.stat /workspace/from-watch-{token}\r".encode())
            watch.stdin.flush()
        with clients() as opened:
            attacher = term.attach(opened)
            assert term.idle()
            calls = len(term.events("tool_call"))
            attacher.send(f"fs.stat /workspace/seen-{token}\r".encode())
            assert wait_for(lambda: f"seen-{token}".encode() in seen, WAIT), bytes(seen)
            assert term.idle(calls + 1)
            term.settle(attacher)
            assert f"from-watch-{token}".encode() not in attacher.data
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.wait()
        reader.join(timeout=5)


def test_ctx_agent_attach_types_into_the_terminal(term: TermHost) -> None:
    """A-2: ``ctx agent attach <agent> --session S`` writes its input to the PTY and shows
    the output: a command piped into it runs in the agent's terminal."""
    token = uuid.uuid4().hex[:8]
    assert term.idle()
    calls = len(term.events("tool_call"))
    attach = subprocess.Popen(
        [*CTX_ARGV, "agent", "attach", "coder", "--session", term.session],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=term.env,
    )
    seen = bytearray()
    reader = threading.Thread(
        target=lambda: [seen.extend(chunk) for chunk in iter(lambda: attach.stdout.read1(), b"")],
        daemon=True,
    )
    reader.start()
    try:
        attach.stdin.write(f"fs.stat /workspace/piped-{token}\r".encode())
        attach.stdin.flush()
        assert term.idle(calls + 1)
        assert wait_for(lambda: f"piped-{token}".encode() in seen, WAIT), bytes(seen)
    finally:
        attach.kill()
        attach.wait()
        reader.join(timeout=5)


def test_tsh_in_the_terminal_runs_no_host_command(term: TermHost) -> None:
    """A-1, H-1: ``ctxterm`` starts ``tsh``, which is not a host shell: host commands from
    ``PATH`` (``touch``, ``sh -c``) are never run."""
    token = uuid.uuid4().hex[:8]
    with clients() as opened:
        client = term.attach(opened)
        client.send(f"touch /workspace/host-{token}\r".encode())
        client.send(f"sh -c 'touch /workspace/shell-{token}'\r".encode())
        term.settle(client)
    assert not (term.ws / f"host-{token}").exists()
    assert not (term.ws / f"shell-{token}").exists()


@needs_fuse
def test_terminal_socket_is_reached_at_its_ctx_path_through_a_mount(term: TermHost) -> None:
    """A-2, F-1: the socket's ABI path is
    ``/ctx/home/<uid>/agent/<agent>/session/<session>/terminal/main.sock``: with the storage
    root mounted by ``ctx mount``, a client connecting at that path joins the terminal."""
    token = uuid.uuid4().hex[:8]
    assert term.idle()
    calls = len(term.events("tool_call"))
    view = term.top / f"ctx-{token}"
    with mount(term, view), clients() as opened:
        at_ctx = view / term.link.relative_to(term.storage)
        client = Client(at_ctx, f"attach\nfs.stat /workspace/via-ctx-{token}\r".encode())
        opened.append(client)
        assert client.shows(f"via-ctx-{token}")
        assert term.idle(calls + 1)


# ---------------------------------------------------------------- agent.create, agent.update


def make_parent(world: World) -> Path:
    """Agent ``parent`` (label ``parent_t``) holding ``agent.create`` and ``fs.stat`` on
    both policy layers and a read-only mount of a directory at ``/workspace``; the host has
    not granted it any ``agent:`` permission yet.  Returns the mounted directory."""
    work = world.top / "parent-work"
    work.mkdir(mode=0o755)
    world.agent(
        {
            "name": "parent",
            "label": "parent_t",
            "tools": ["agent.create", "fs.stat"],
            "mount": [[str(work), "/workspace", "ro"]],
        }
    )
    world.allow_tool("parent_t", "agent.create", "fs.stat")
    return work


def grant_create(world: World, child: str) -> None:
    with (world.storage / "agent" / "parent.d" / "policy").open("a") as policy:
        policy.write(f"allow parent_t agent:{child} create\n")


def create_child(world: World, child_request: dict) -> Run:
    return world.run("parent", "agent.create", json.dumps(child_request))


@needs_root
def test_agent_create_tool_needs_the_grant_for_that_child_name(world: World) -> None:
    """A-4, P-7: the parent must hold ``agent:<child> create`` for the concrete name: with
    no grant nothing is made; with ``agent:review-1 create`` the child ``review-2`` is still
    refused and ``review-1`` is made."""
    make_parent(world)
    child = {"name": "review-1", "label": "review_t", "tools": ["fs.stat"]}
    refused = create_child(world, child)
    assert refused.rc != 0, refused
    assert not (world.storage / "agent" / "review-1").exists()
    grant_create(world, "review-1")
    other = create_child(world, {**child, "name": "review-2"})
    assert other.rc != 0, other
    assert not (world.storage / "agent" / "review-2").exists()
    made = create_child(world, child)
    assert made.rc == 0, made
    assert (world.storage / "agent" / "review-1").is_file()
    assert (world.storage / "agent" / "review-1.d").is_dir()


@needs_root
def test_agent_create_tool_keeps_child_permissions_and_mounts_within_the_parents(
    world: World,
) -> None:
    """A-4: the child's permissions are a subset of the parent's (a tool the parent may not
    run is refused) and its mounts a subset of the parent's visible mounts (another
    directory, or read-write where the parent has read-only, is refused); a child within
    both is made."""
    work = make_parent(world)
    grant_create(world, "review-1")
    other = world.top / "elsewhere"
    other.mkdir()
    base = {"name": "review-1", "label": "review_t"}
    for wider in (
        {"tools": ["fs.write"]},
        {"mount": [[str(other), "/data", "ro"]]},
        {"mount": [[str(work), "/workspace", "rw"]]},
    ):
        refused = create_child(world, {**base, **wider})
        assert refused.rc != 0, (wider, refused)
        assert not (world.storage / "agent" / "review-1").exists(), wider
    made = create_child(
        world, {**base, "tools": ["fs.stat"], "mount": [[str(work), "/workspace", "ro"]]}
    )
    assert made.rc == 0, made
    assert (world.storage / "agent" / "review-1").is_file()


@needs_root
def test_agent_create_tool_child_inherits_nothing(world: World) -> None:
    """A-4: grants are explicit and per child name; nothing is inherited by default: the
    child's policy holds what its request listed and none of the parent's other grants."""
    make_parent(world)
    grant_create(world, "review-1")
    made = create_child(world, {"name": "review-1", "label": "review_t", "tools": ["fs.stat"]})
    assert made.rc == 0, made
    policy = world.storage / "agent" / "review-1.d" / "policy"
    assert world.policy_allows(policy, "review_t", "tool:fs.stat", "execute")
    assert not world.policy_allows(policy, "review_t", "tool:agent.create", "execute")
    assert not world.policy_allows(policy, "review_t", "agent:review-1", "create")
    assert not world.policy_allows(policy, "parent_t", "tool:agent.create", "execute")


@needs_root
def test_agent_create_tool_refuses_an_illegal_child_name(world: World) -> None:
    """A-4, R-3: the child's name must be legal: ``../escape`` and ``x.d`` are refused and
    nothing appears anywhere in the storage root."""
    make_parent(world)
    before = paths_under(world.storage)
    for name in ("../escape", "x.d"):
        refused = create_child(world, {"name": name, "label": "review_t"})
        assert refused.rc != 0, (name, refused)
    assert not (world.storage / "escape").exists()
    created = {p for p in paths_under(world.storage) - before if not p.startswith("home")}
    assert created == set(), created


def make_self_updater(world: World, grant_tool_side: bool = True) -> Path:
    world.agent({"name": "selfy", "label": "selfy_t", "tools": ["agent.update"]})
    if grant_tool_side:
        world.allow_tool("selfy_t", "agent.update")
    return world.storage / "agent" / "selfy.d"


def update(world: World, control: str, content: str, **extra) -> Run:
    payload = json.dumps({"control": control, "content": content, **extra})
    return world.run("selfy", "agent.update", payload)


@needs_root
def test_agent_update_replaces_its_own_system_md_and_is_recorded(world: World) -> None:
    """A-5: ``agent.update`` replaces the caller's own ``system.md`` (or
    ``prompt.template.md``) and is recorded as ordinary ``tool_call``/``tool_result``
    events of the session."""
    controls = make_self_updater(world)
    done = update(world, "system.md", "You review code.\n")
    assert done.rc == 0, done
    assert (controls / "system.md").read_text() == "You review code.\n"
    done = update(world, "prompt.template.md", "Task: {{input}}\n")
    assert done.rc == 0, done
    assert (controls / "prompt.template.md").read_text() == "Task: {{input}}\n"
    events = []
    for log in (world.storage / "home").glob("*/agent/selfy/session/*/events.jsonl"):
        events += read_jsonl(log)
    kinds = [e["type"] for e in events if e.get("object") == "tool/agent.update"]
    assert kinds.count("tool_call") == 2 and kinds.count("tool_result") == 2, events


@needs_root
def test_agent_update_of_any_other_control_is_einval(world: World) -> None:
    """A-5: any other control (policy, mount, model, window, identity files) is EINVAL and
    nothing in the agent's controls changes."""
    controls = make_self_updater(world)
    before = snapshot(controls)
    for control in ("policy", "mount", "identity"):
        refused = update(world, control, "allow selfy_t tool:fs.write execute\n")
        assert refused.rc != 0 and "EINVAL" in refused.err, (control, refused)
    after = snapshot(controls)
    assert {k: v for k, v in after.items() if k != "log"} == {
        k: v for k, v in before.items() if k != "log"
    }


@needs_root
def test_agent_update_rejects_payloads_over_8_kib(world: World) -> None:
    """A-5: payloads over 8 KiB are rejected (the file stays as it was); 8 KiB are taken.
    8 KiB counts bytes: 4097 two-byte characters are over it."""
    controls = make_self_updater(world)
    exact = "x" * 8192
    done = update(world, "system.md", exact)
    assert done.rc == 0, done
    assert (controls / "system.md").read_text() == exact
    for content in ("y" * 8193, "\u00e9" * 4097):
        refused = update(world, "system.md", content)
        assert refused.rc != 0, refused
        assert (controls / "system.md").read_text() == exact


@needs_root
def test_agent_update_cannot_rewrite_another_agent(world: World) -> None:
    """A-5: the host binds the request to the caller's agent: naming another agent in the
    payload never changes that agent's ``system.md``."""
    make_self_updater(world)
    world.agent({"name": "other", "label": "other_t"})
    theirs = world.storage / "agent" / "other.d" / "system.md"
    before = theirs.read_bytes()
    extra = {"agent": "other", "name": "other", "target": "agent/other.d/system.md"}
    update(world, "system.md", "rewritten by selfy\n", **extra)
    assert theirs.read_bytes() == before


@needs_root
def test_agent_update_needs_both_policy_layers(world: World) -> None:
    """A-5, P-6: ``agent.update`` needs ``allow <agent>_t tool:agent.update execute`` in both
    the agent and the tool policy; with the tool layer missing the call is EACCES and the
    control is unchanged."""
    controls = make_self_updater(world, grant_tool_side=False)
    before = (controls / "system.md").read_bytes()
    refused = update(world, "system.md", "new\n")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert (controls / "system.md").read_bytes() == before


# ====================================================================== §9 shared spaces


@pytest.fixture
def space_group() -> tuple:
    """A system group with one member user: ``(member, gid)``."""
    users, gid = members_of("ctxtsm-g", "ctxtsm-m")
    return users[0], gid


@needs_root
def test_shared_space_has_tool_data_queue_agent(world: World, space_group) -> None:
    """X-1, §2: ``shared/<name>/`` holds ``tool/``, ``data/``, ``queue/`` (with exactly the
    six queue directories) and ``agent/``, whether ``ctx shared create`` or ``ctx queue
    init --project`` made it; no root entry is added."""
    _, gid = space_group
    made = world.ctx("shared", "create", "proj", "--group", str(gid))
    assert made.rc == 0, made
    made = world.ctx("queue", "init", "--project", "build")
    assert made.rc == 0, made
    for name in ("proj", "build"):
        space = world.storage / "shared" / name
        for part in ("tool", "data", "queue", "agent"):
            assert (space / part).is_dir() and not (space / part).is_symlink(), (name, part)
        queue_dirs = {p.name for p in (space / "queue").iterdir() if p.is_dir()}
        assert queue_dirs == QUEUE_DIRS, name
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES


@needs_root
def test_shared_space_is_governed_by_linux_permissions(
    world: World, space_group, unprivileged_user
) -> None:
    """X-1: a shared space is a Linux-permission space: a member of its group creates an
    ordinary file in ``data/``; a user outside it may neither create nor list there."""
    member, gid = space_group
    made = world.ctx("shared", "create", "proj", "--group", str(gid))
    assert made.rc == 0, made
    data = world.storage / "shared" / "proj" / "data"
    wrote = run_as(member, ["/bin/sh", "-c", f"echo note > {data}/by-member"], member.groups)
    assert wrote.returncode == 0, wrote
    assert (data / "by-member").read_text() == "note\n"
    outsider = unprivileged_user
    refused = run_as(outsider, ["/bin/sh", "-c", f"echo x > {data}/by-outsider"])
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    listed = run_as(outsider, ["/bin/ls", str(data)])
    assert listed.returncode != 0 and "Permission denied" in listed.stderr, listed
    assert not (data / "by-outsider").exists()


@needs_fuse
def test_agent_view_shows_a_space_only_with_group_and_policy(
    world: World, space_group, unprivileged_user
) -> None:
    """X-1, F-1: visibility of a space to an agent needs its uid/gid and the directory
    permissions and policy v0 (``shared:<name> read``): an agent of the group with the grant
    sees ``shared/proj`` in its view; one outside the group, or without the grant, does
    not see it and cannot reach its ``data/``."""
    member, gid = space_group
    assert world.ctx("shared", "create", "proj", "--group", str(gid)).rc == 0
    world.agent(
        {"name": "reader", "label": "reader_t", "shared": {"proj": ["read"]}},
        "--user",
        member.name,
    )
    world.agent(
        {"name": "stranger", "label": "stranger_t", "shared": {"proj": ["read", "write"]}},
        "--user",
        unprivileged_user.name,
    )
    world.agent({"name": "ungranted", "label": "ungranted_t"}, "--user", member.name)
    views = {name: world.top / f"view-{name}" for name in ("reader", "stranger", "ungranted")}
    with (
        mount(world, views["reader"], "--as", "reader"),
        mount(world, views["stranger"], "--as", "stranger"),
        mount(world, views["ungranted"], "--as", "ungranted"),
    ):
        assert "proj" in os.listdir(views["reader"] / "shared")
        assert {"tool", "data", "queue", "agent"} <= set(
            os.listdir(views["reader"] / "shared" / "proj")
        )
        for hidden in ("stranger", "ungranted"):
            assert "proj" not in os.listdir(views[hidden] / "shared"), hidden
            with pytest.raises(OSError) as failed:
                os.listdir(views[hidden] / "shared" / "proj" / "data")
            assert failed.value.errno in (errno.ENOENT, errno.EACCES), hidden


@needs_fuse
def test_agent_writes_ordinary_files_in_a_space_only_with_write(world: World, space_group) -> None:
    """X-1, F-1, P-3: with ``shared:proj write`` an agent creates an ordinary file in the
    space through its view (no collaboration DSL), and once ``fsync`` returned it is in the
    storage root; with ``read`` only the write is EACCES and nothing is made."""
    member, gid = space_group
    assert world.ctx("shared", "create", "proj", "--group", str(gid)).rc == 0
    world.agent(
        {"name": "reader", "label": "reader_t", "shared": {"proj": ["read"]}},
        "--user",
        member.name,
    )
    world.agent(
        {"name": "writer", "label": "writer_t", "shared": {"proj": ["read", "write"]}},
        "--user",
        member.name,
    )
    data = world.storage / "shared" / "proj" / "data"
    with (
        mount(world, world.top / "view-reader", "--as", "reader"),
        mount(world, world.top / "view-writer", "--as", "writer"),
    ):
        target = world.top / "view-reader" / "shared" / "proj" / "data" / "from-reader.txt"
        assert write_denied(target) == errno.EACCES
        notes = world.top / "view-writer" / "shared" / "proj" / "data" / "notes.txt"
        fd = os.open(notes, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"design notes\n")
            os.fsync(fd)
            assert (data / "notes.txt").read_bytes() == b"design notes\n"
        finally:
            os.close(fd)
    assert (data / "notes.txt").is_file() and not (data / "notes.txt").is_symlink()
    assert not (data / "from-reader.txt").exists()


# ====================================================================== §10 ctxmcp


def project(
    server: McpServer | Path,
    out: Path,
    name: str | None = None,
    runtime: str = "/mcp/mcp.json",
    env: dict[str, str] | None = None,
) -> Run:
    """``ctxmcp project --config C --runtime-config R --server NAME --out DIR`` (M-1)."""
    config = server.config if isinstance(server, McpServer) else server
    name = name or (server.name if isinstance(server, McpServer) else "")
    return ctxmcp(
        "project", "--config", config, "--runtime-config", runtime,
        "--server", name, "--out", out, env=env,
    )  # fmt: skip


def nothing_in(out: Path) -> bool:
    return not out.exists() or list(out.iterdir()) == []


@needs_time_server
def test_ctxmcp_projects_a_real_server(world: World) -> None:
    """M-1, M-3, M-4, T-8, R-2: ``ctxmcp project`` of a real stdio server writes the
    candidates ``<server>.<tool>.manifest.json`` (no ``mcp.`` prefix) into ``--out``, each
    a valid v2 manifest whose locator is the strict stdio one (transport, the runtime
    config path, server, tool), and installs nothing, grants no policy and writes nothing
    in the storage root."""
    config = world.top / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": str(TIME_SERVER)}}}))
    before = snapshot(world.storage)
    out = world.top / "mcp-manifests"
    projected = project(config, out, "time", "/workspace/.mcp.json", env=world.env)
    assert projected.rc == 0, projected
    assert snapshot(world.storage) == before
    names = sorted(p.name for p in out.iterdir())
    assert names == ["time.convert_time.manifest.json", "time.get_current_time.manifest.json"]
    candidate = json.loads((out / "time.get_current_time.manifest.json").read_text())
    assert candidate["manifest"] == 2 and candidate["kind"] == "tool"
    assert candidate["name"] == "time.get_current_time" and "exec" not in candidate
    locator = candidate["mcp"]
    assert {"transport", "server", "tool"} <= set(locator) and len(locator) == 4
    assert locator["transport"] == "stdio" and "/workspace/.mcp.json" in locator.values()
    assert locator["server"] == "time" and locator["tool"] == "get_current_time"
    checked = world.ctx("object", "check", out / "time.get_current_time.manifest.json")
    assert checked.rc == 0, checked


def test_ctxmcp_list_announces_2025_11_25(world: World) -> None:
    """M-1, M-2, M-3: ``ctxmcp list --config CONFIG.json --server NAME`` announces protocol
    version ``2025-11-25`` in its ``initialize`` and names the tools
    ``<server>.<remote_tool>``."""
    server = mcp_server(world.top, [remote_tool("echo")])
    listed = ctxmcp("list", "--config", server.config, "--server", server.name)
    assert listed.rc == 0, listed
    assert "demo.echo" in listed.out and "mcp.demo" not in listed.out
    initialize = [m for m in server.received() if m.get("method") == "initialize"]
    assert len(initialize) == 1, server.received()
    assert initialize[0]["params"]["protocolVersion"] == "2025-11-25"


def test_ctxmcp_accepts_each_stable_version(world: World) -> None:
    """M-2: the negotiated stable versions 2025-11-25, 2025-06-18, 2025-03-26 and
    2024-11-05 are accepted: the server's tools are projected."""
    for version in STABLE_VERSIONS:
        server = mcp_server(world.top, [remote_tool("echo")], version=version)
        out = world.top / f"out-{version}"
        projected = project(server, out)
        assert projected.rc == 0, (version, projected)
        assert (out / "demo.echo.manifest.json").is_file(), version


def test_ctxmcp_refuses_draft_unknown_and_future_versions(world: World) -> None:
    """M-2: a draft, unknown or future negotiated version is refused: a non-zero exit and
    no candidate written."""
    for version in ("2024-10-07", "2026-06-30", "DRAFT-2026-v1"):
        server = mcp_server(world.top, [remote_tool("echo")], version=version)
        out = world.top / f"out-{version}"
        projected = project(server, out)
        assert projected.rc != 0, (version, projected)
        assert nothing_in(out), version


def test_ctxmcp_reports_and_skips_illegal_projected_names(world: World) -> None:
    """M-3, R-3: a remote tool whose projected name is illegal (a ``/``, a space, a
    non-ASCII byte, a ``.d`` ending, more than 64 bytes) is reported and skipped; the legal
    ones, up to exactly 64 bytes, are projected."""
    longest = "t" * 62  # "s." + 62 bytes = 64
    illegal = ["bad/name", "has space", "caf\u00e9", "ctl.d", "u" * 63]
    server = mcp_server(world.top, [remote_tool(n) for n in ["ok", longest, *illegal]], name="s")
    out = world.top / "out"
    projected = project(server, out)
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(["s.ok.manifest.json", f"s.{longest}.manifest.json"]), projected
    for name in illegal:
        assert name in projected.out + projected.err, (name, projected)


def test_ctxmcp_copies_no_configuration_or_secret(world: World) -> None:
    """M-4: projection never copies external config or secrets: the candidates hold
    neither the server's environment, nor its command, nor its arguments."""
    secret = f"sk-{uuid.uuid4().hex}"
    server = mcp_server(
        world.top,
        [remote_tool("echo")],
        secret_env={"DEMO_API_TOKEN": secret},
        extra_args=(f"--token={secret}",),
    )
    out = world.top / "out"
    projected = project(server, out)
    assert projected.rc == 0, projected
    text = (out / "demo.echo.manifest.json").read_text()
    assert secret not in text and "DEMO_API_TOKEN" not in text
    assert "server.py" not in text and PYTHON not in text
    assert secret not in projected.out + projected.err


def test_ctxmcp_keeps_no_registry(world: World) -> None:
    """M-1, M-3: there is no registry: ``ctxmcp list`` and ``ctxmcp project`` write nothing
    but the candidates in ``--out`` (nothing in the home, data, config, cache or state
    directories)."""
    server = mcp_server(world.top, [remote_tool("echo")])
    homes = world.top / "homes"
    places = {n: homes / n for n in ("home", "data", "config", "cache", "state")}
    for place in places.values():
        place.mkdir(parents=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(places["home"]),
        "XDG_DATA_HOME": str(places["data"]),
        "XDG_CONFIG_HOME": str(places["config"]),
        "XDG_CACHE_HOME": str(places["cache"]),
        "XDG_STATE_HOME": str(places["state"]),
        "CTX_STORAGE": str(world.storage),
    }
    before = snapshot(world.storage)
    assert ctxmcp("list", "--config", server.config, "--server", "demo", env=env).rc == 0
    out = world.top / "out"
    assert project(server, out, env=env).rc == 0
    assert paths_under(homes) == set(places)
    assert sorted(os.listdir(out)) == ["demo.echo.manifest.json"]
    assert snapshot(world.storage) == before


def test_ctxmcp_refuses_what_the_contract_excludes(world: World) -> None:
    """M-1, M-4: ctxmcp writes nothing under /ctx (an ``--out`` in the storage root, named
    directly or through a symbolic link, is refused and nothing appears there); only stdio
    servers are projected (an HTTP server is refused); the locator's config path is the
    visible *absolute* one (a relative ``--runtime-config`` is refused)."""
    server = mcp_server(world.top, [remote_tool("echo")])
    link = world.top / "into-root"
    link.symlink_to(world.storage / "shared")
    before = snapshot(world.storage)
    for out in (world.storage / "tool", world.storage / "shared" / "cands", link / "cands"):
        projected = project(server, out, env=world.env)
        assert projected.rc != 0, (out, projected)
    assert snapshot(world.storage) == before
    http = world.top / "http.json"
    http.write_text(json.dumps({"mcpServers": {"web": {"url": "http://127.0.0.1:9/mcp"}}}))
    refused = project(http, world.top / "out-http", "web")
    assert refused.rc != 0 and nothing_in(world.top / "out-http"), refused
    refused = project(server, world.top / "out-rel", runtime="workspace/.mcp.json")
    assert refused.rc != 0 and nothing_in(world.top / "out-rel"), refused


@needs_root
def test_object_install_refuses_a_locator_that_is_not_strict(world: World) -> None:
    """M-4, T-8: the ``mcp`` control is a *strict* stdio locator: a candidate whose locator
    adds a command or environment, names another transport or a relative config path is
    refused by ``ctx object install`` and nothing is installed."""
    server = mcp_server(world.top, [remote_tool("echo")])
    out = world.top / "out"
    assert project(server, out).rc == 0
    good = json.loads((out / "demo.echo.manifest.json").read_text())
    changes = (
        {"command": PYTHON},
        {"env": {"TOKEN": "x"}},
        {"transport": "http"},
        {"config": "mcp.json"},
    )
    for index, change in enumerate(changes):
        path = world.top / f"bad-{index}.manifest.json"
        path.write_text(json.dumps(dict(good, mcp={**good["mcp"], **change})))
        refused = world.ctx("object", "install", path, "--tier", "system")
        assert refused.rc != 0, (change, refused)
        assert not (world.storage / "tool" / "demo.echo").exists(), change


@needs_root
def test_projected_tool_is_an_ordinary_tool_under_the_same_policy(world: World) -> None:
    """M-4, T-1, T-8, P-6: ``ctx object install --source STORAGE CANDIDATE --tier system``
    makes ``tool/<server>.<tool>`` with the ordinary controls and its ``mcp`` locator;
    installing grants nothing (EACCES), and once ``allow <label> tool:<name> execute`` is in
    both policies the agent's call reaches the server's tool."""
    server = mcp_server(world.top, [remote_tool("echo")])
    out = world.top / "out"
    assert project(server, out).rc == 0
    candidate = out / "demo.echo.manifest.json"
    installed = ctx_run(
        "object", "install", "--source", world.storage, candidate, "--tier", "system"
    )
    assert installed.rc == 0, installed
    tool = world.storage / "tool" / "demo.echo"
    assert tool.is_file() and tool.stat().st_mode & 0o111
    for control in (*T1_CONTROLS, "mcp"):
        assert (world.storage / "tool" / "demo.echo.d" / control).is_file(), control
    assert not [p for p in os.listdir(world.storage / "tool") if p.startswith("mcp.")]
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES
    mounts = [[str(server.dir), "/mcp", "ro"]]
    world.agent({"name": "coder", "label": "coder_t", "tools": ["demo.echo"], "mount": mounts})
    refused = world.run("coder", "demo.echo", '{"text": "hello"}')
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    world.allow_tool("coder_t", "demo.echo")
    called = world.run("coder", "demo.echo", '{"text": "hello-from-coder"}')
    assert called.rc == 0, called
    assert "hello-from-coder" in called.out


# ====================================================================== §11 reserved PTC


@needs_root
def test_no_programmatic_tool_calling_is_announced(world: World) -> None:
    """C-1: the current ABI does not announce a ``programmatic_tool_calling`` tool or
    ``allowed_callers``: neither is among the installed objects nor in any tool's
    controls."""
    listed = world.ctx("object", "list")
    assert listed.rc == 0, listed
    assert "programmatic_tool_calling" not in listed.out
    assert not (world.storage / "tool" / "programmatic_tool_calling").exists()
    for path in (world.storage / "tool").rglob("*"):
        if path.is_file() and path.stat().st_size < 65536:
            text = path.read_text(errors="replace")
            assert "allowed_callers" not in text, path
            assert "programmatic_tool_calling" not in text, path


@needs_root
def test_schema_is_never_an_output_schema(world: World) -> None:
    """C-1, T-1: ``schema`` is the input schema only: a tool whose output would fail it as
    an output schema still succeeds and its output is delivered."""
    manifest = tool_manifest(world.top / "m", "strict", "#!/bin/sh\necho '{\"extra\": 1}'\n")
    document = json.loads(manifest.read_text())
    document["schema"] = {"type": "object", "additionalProperties": False, "properties": {}}
    manifest.write_text(json.dumps(document))
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    world.agent({"name": "coder", "label": "coder_t", "tools": ["strict"]})
    world.allow_tool("coder_t", "strict")
    called = world.run("coder", "strict", "{}")
    assert called.rc == 0, called
    assert '"extra": 1' in called.out


@needs_root
def test_program_control_malformed_makes_the_tool_unavailable(
    world: World,
) -> None:
    """C-2: ``program`` is validated by ``object install``: a valid object installs and the
    tool runs; a malformed or non-object one (or one failing schema validation) makes
    the tool unavailable: it cannot be run even when both policies allow it."""
    world.agent({"name": "coder", "label": "coder_t", "tools": ["good", "p0", "p2"]})
    for name, program in (
        ("good", {"type": "object", "additionalProperties": False}),
        ("p0", "yes"),
        ("p2", {"type": 5}),
    ):
        manifest = tool_manifest(world.top / "m", name, '#!/bin/sh\necho "{}"\n')
        document = json.loads(manifest.read_text())
        document["program"] = program
        manifest.write_text(json.dumps(document))
        installed = world.ctx("object", "install", manifest, "--tier", "system")
        called = None
        if installed.rc == 0:
            world.allow_tool("coder_t", name)
            called = world.run("coder", name, "{}")
        usable = called is not None and called.rc == 0
        assert usable is (name == "good"), (name, installed, called)


@needs_root
def test_damaged_program_control_makes_the_tool_unavailable_and_grants_nothing(
    world: World,
) -> None:
    """C-2: a ``program`` control that is not JSON, or not an object, makes the installed
    tool unavailable although both policies allow it; a valid one grants nothing without
    the policies (EACCES)."""
    world.agent({"name": "coder", "label": "coder_t", "tools": ["prog"]})
    manifest = tool_manifest(world.top / "m", "prog", '#!/bin/sh\necho "{}"\n')
    document = json.loads(manifest.read_text())
    document["program"] = {"type": "object"}
    manifest.write_text(json.dumps(document))
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    refused = world.run("coder", "prog", "{}")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    world.allow_tool("coder_t", "prog")
    assert world.run("coder", "prog", "{}").rc == 0
    control = world.storage / "tool" / "prog.d" / "program"
    for damaged in ("not json {", '"object"'):
        control.write_text(damaged)
        called = world.run("coder", "prog", "{}")
        assert called.rc != 0, (damaged, called)


# ====================================================================== §12 the manual bundle


def test_bundle_holds_readme_and_seven_pages_mirroring_docs_spec(template: Path) -> None:
    """D-1: ``shared/cortexfs-docs/README.md`` and ``man/ctx.{agent,tool,model,coreutils,
    root-abi,session,provider}.md`` mirror ``docs/spec/*.md``; they are read-only
    documents."""
    bundle = template / "shared" / "cortexfs-docs"
    assert (bundle / "README.md").read_bytes() == (REPO / "docs/spec/README.md").read_bytes()
    assert sorted(os.listdir(bundle / "man")) == sorted(MAN_PAGES.values())
    for page in MAN_PAGES.values():
        installed = bundle / "man" / page
        assert installed.read_bytes() == (REPO / "docs" / "spec" / page).read_bytes(), page
        assert installed.stat().st_mode & 0o222 == 0, page
    assert (bundle / "README.md").stat().st_mode & 0o222 == 0


@needs_root
def test_ctx_man_aliases_print_the_installed_pages(world: World) -> None:
    """D-1: ``ctx man TOPIC`` reads the installed file; ``agent``, ``model``, … are CLI
    aliases of ``ctx.agent.md``, …: what it prints is the installed page, even one changed
    after installation."""
    pages = world.storage / "shared" / "cortexfs-docs" / "man"
    for topic, page in MAN_PAGES.items():
        shown = world.ctx("man", topic)
        assert shown.rc == 0, shown
        assert shown.out == (pages / page).read_text(), topic
    changed = pages / "ctx.tool.md"
    changed.chmod(0o644)
    with changed.open("a") as page:
        page.write("\nLOCAL NOTE 7f3a\n")
    shown = world.ctx("man", "tool")
    assert shown.rc == 0 and "LOCAL NOTE 7f3a" in shown.out, shown


def test_ctx_man_falls_back_to_the_built_in_copy(world: World) -> None:
    """D-1: where no bundle is installed, ``ctx man TOPIC`` falls back to a built-in copy
    (that mirrors ``docs/spec``)."""
    empty = world.top / "no-bundle"
    empty.mkdir()
    for topic in ("agent", "session"):
        shown = ctx_run("man", topic, env=clean_env(CTX_STORAGE=str(empty)))
        assert shown.rc == 0, shown
        assert shown.out == (REPO / "docs" / "spec" / MAN_PAGES[topic]).read_text()


@needs_fuse
def test_manuals_cannot_be_written_through_an_agent_view(world: World) -> None:
    """D-1, F-1: manuals are read-only documents: writing a page through an agent's view is
    refused (EACCES) and the page is unchanged."""
    world.agent({"name": "coder", "label": "coder_t"})
    page = world.storage / "shared" / "cortexfs-docs" / "man" / "ctx.agent.md"
    before = page.read_bytes()
    view = world.top / "view"
    with mount(world, view, "--as", "coder"):
        seen = view / "shared" / "cortexfs-docs" / "man" / "ctx.agent.md"
        assert write_denied(seen) == errno.EACCES
        assert write_denied(view / "shared" / "cortexfs-docs" / "man" / "ctx.x.md") == errno.EACCES
    assert page.read_bytes() == before
    assert not (page.parent / "ctx.x.md").exists()


# ====================================================================== §13 mounting /ctx


@needs_fuse
def test_host_mount_shows_the_root_abi_and_refuses_new_root_entries(world: World) -> None:
    """F-1, R-2: ``ctx mount MOUNTPOINT`` shows exactly the six root entries; nothing else
    may be created at the root (``audit/``, ``mcp/``, a file); ``/ctx/mcp/github`` does not
    exist; ``ctx umount`` unmounts and the mount process ends."""
    view = world.top / "ctx"
    with mount(world, view) as proc:
        assert set(os.listdir(view)) == ROOT_ENTRIES
        for name in ("audit", "mcp", "queue"):
            with pytest.raises(OSError):
                (view / name).mkdir()
        assert write_denied(view / "registry") is not None
        assert not (view / "mcp" / "github").exists()
        umounted = ctx_run("umount", view)
        assert umounted.rc == 0, umounted
        assert not mounted_at(view)
        proc.wait(timeout=WAIT)
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES


@needs_fuse
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_fsync_through_the_mount_is_an_fsync_of_the_file_behind_it(world: World) -> None:
    """F-1: writes through the mount have the same durability as direct writes once
    ``fsync`` returns: the file written and fsynced through the mount holds the bytes, and
    the mount process fsynced the file behind it."""
    trace = world.top / "mount.trace"
    view = world.top / "ctx"
    behind = world.storage / "shared" / "notes"
    behind.mkdir()
    behind.chmod(0o755)
    wrap = ("strace", "-f", "-qq", "-e", "trace=openat,fsync,fdatasync", "-o", str(trace))
    with mount(world, view, wrap=wrap):
        fd = os.open(view / "shared" / "notes" / "kept.txt", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"kept after a crash\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        assert (behind / "kept.txt").read_bytes() == b"kept after a crash\n"
    lines = trace.read_text().splitlines()
    opened = {
        line.split()[0] + ":" + line.rsplit("= ", 1)[1].split()[0]
        for line in lines
        if '"kept.txt"' in line and "O_WRONLY" in line and "= -1" not in line
    }
    synced = {
        line.split()[0] + ":" + line.split("(", 1)[1].split(")", 1)[0]
        for line in lines
        if ("fsync(" in line or "fdatasync(" in line) and line.rstrip().endswith("= 0")
    }
    assert opened & synced, (opened, synced)


@needs_fuse
def test_sigterm_unmounts_cleanly(world: World) -> None:
    """F-1: SIGTERM to ``ctx mount`` unmounts cleanly: the mount point is no longer a mount
    and the process ends."""
    view = world.top / "ctx"
    with mount(world, view) as proc:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=WAIT)
        assert wait_for(lambda: not mounted_at(view), WAIT)


@needs_fuse
def test_agent_view_lists_only_tools_that_pass_the_chain(world: World) -> None:
    """F-1, T-5, P-6: ``ctx mount MOUNTPOINT --as AGENT`` lists only the tools that pass the
    effective authority check: granted in both policies and executable; one granted in the
    agent's policy only, or not granted, is not listed and cannot be opened."""
    world.agent({"name": "coder", "label": "coder_t", "tools": ["fs.stat", "fs.read"]})
    world.allow_tool("coder_t", "fs.stat")
    view = world.top / "ctx"
    with mount(world, view, "--as", "coder"):
        listed = set(os.listdir(view / "tool"))
        assert {"fs.stat", "fs.stat.d"} <= listed
        for hidden in ("fs.read", "fs.write", "shell.exec"):
            assert hidden not in listed and f"{hidden}.d" not in listed, hidden
            with pytest.raises(OSError) as failed:
                os.stat(view / "tool" / f"{hidden}.d" / "policy")
            assert failed.value.errno in (errno.ENOENT, errno.EACCES), hidden


@needs_fuse
def test_agent_view_writes_are_checked_by_the_chain(world: World) -> None:
    """F-1, P-6: writes through an agent's view are checked with the same chain: the
    agent may not rewrite a tool's policy or its own controls (EACCES), even when the
    calling process is root."""
    world.agent({"name": "coder", "label": "coder_t", "tools": ["fs.stat"]})
    world.allow_tool("coder_t", "fs.stat")
    before = snapshot(world.storage / "tool")
    view = world.top / "ctx"
    with mount(world, view, "--as", "coder"):
        assert write_denied(view / "tool" / "fs.stat.d" / "policy") == errno.EACCES
        assert write_denied(view / "agent" / "coder.d" / "policy") == errno.EACCES
        assert write_denied(view / "tool" / "evil") == errno.EACCES
    assert snapshot(world.storage / "tool") == before


@needs_fuse
def test_agent_view_creates_no_persistent_file(world: World) -> None:
    """F-1, T-5: the agent view is an in-memory projection: mounting it, walking and
    reading everything in it and being refused a write create no persistent file."""
    world.agent({"name": "coder", "label": "coder_t", "tools": ["fs.stat"]})
    world.allow_tool("coder_t", "fs.stat")
    before = paths_under(world.storage)
    view = world.top / "ctx"
    with mount(world, view, "--as", "coder"):
        for dirpath, _, filenames in os.walk(view):
            for name in filenames:
                with contextlib.suppress(OSError), open(Path(dirpath, name), "rb") as seen:
                    seen.read(4096)
        write_denied(view / "tool" / "fs.stat.d" / "policy")
    assert paths_under(world.storage) == before


# ====================================================================== §14 several machines


def claimed_job(world: World, holder: subprocess.Popen) -> tuple[QueueCLI, str]:
    queue = QueueCLI(world.storage, "proj")
    assert queue.run("init").rc == 0
    queue.publish(request("fs.stat"))
    job = queue.claim("--pid", str(holder.pid), "--ttl", "3600")
    return queue, job


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_dead_pid_of_another_host_is_no_proof_its_expiry_is(world: World, holder) -> None:
    """N-1, Q-5: a pid alone is never proof across hosts: a lease of another host and boot
    whose pid is dead here, and which has not expired, is left claimed by ``recover``; the
    lease's ``expires_at`` decides: the same lease, expired, goes back to pending."""
    queue, job = claimed_job(world, holder)
    holder.kill()
    holder.wait()
    lease = queue.lease(job)
    lease.update(host=f"elsewhere-{uuid.uuid4().hex[:6]}", boot_id=str(uuid.uuid4()))
    queue.write_lease(job, lease)
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    assert queue.state(job) == "claimed"
    lease["expires_at"] = "2020-01-01T00:00:00Z"
    queue.write_lease(job, lease)
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    assert queue.state(job) == "pending"


def test_a_lease_of_this_host_before_a_reboot_is_recovered(world: World, holder) -> None:
    """N-1, Q-3, Q-5: a claim's lease names this host, this boot and an expiry (what
    liveness across hosts uses); the same host with another boot proves the holder gone,
    even when a live process has the lease's pid now."""
    queue, job = claimed_job(world, holder)
    lease = queue.lease(job)
    assert lease["host"] == socket.gethostname()
    assert lease["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert lease["expires_at"] and lease["pid"] == holder.pid
    lease["boot_id"] = str(uuid.uuid4())
    queue.write_lease(job, lease)
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    assert queue.state(job) == "pending"


@needs_fuse
def test_one_queue_through_a_fuse_filesystem_and_directly(world: World) -> None:
    """N-1, W-3, I-4: the queue may live on a shared POSIX filesystem: through a FUSE
    filesystem (the host view of ``ctx mount``) and directly at once, every job is claimed
    exactly once and finished, an empty queue is exit 3 with nothing printed (§2.4), and
    ``recover`` finds the queue consistent."""
    direct = QueueCLI(world.storage, "proj")
    assert direct.run("init").rc == 0
    batch = "".join(json.dumps(request("fs.stat", tag=i)) + "\n" for i in range(3))
    published = direct.run("publish", "--batch", "-", input=batch)
    assert published.rc == 0, published
    jobs = set(published.lines())
    assert len(jobs) == 3
    view = world.top / "ctx"
    with mount(world, view):
        shared = QueueCLI(view, "proj")
        claimed: list[str] = []
        for turn in range(3):
            side = shared if turn % 2 else direct
            got = side.run("claim")
            assert got.rc == 0, got
            claimed.append(got.out.strip())
            finished = side.run("finish", claimed[-1], "--ok", "-", input="{}")
            assert finished.rc == 0, finished
        assert sorted(claimed) == sorted(jobs)
        empty = shared.run("claim")
        assert empty.rc == 3 and empty.out == "", empty
        recovered = shared.run("recover")
        assert recovered.rc == 0, recovered
    for job in jobs:
        assert direct.state(job) == "done", job
