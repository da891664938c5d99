"""An ordinary user as the host administrator of their own storage root, end to end (SPEC R-1,
R-5, T-5, A-3, A-4, A-5, P-4, P-5 step 1, W-1, W-4, Q-5, S-1, §3, §10, §13, H-4; README
"Tools, agents and MCP servers" and "Everything else works as any user, on that user's own
storage root"; docs/tools.md "Identity", "Network (P-4)", "Root bootstrapping another uid's
root"; docs/workers.md; docs/mount.md).

Every command runs as the real test user with a login-like environment of its own (HOME, no
``XDG_DATA_HOME``, so the root is ``~/.local/share/cortexfs/storage/current``).  What is
checked: each step either works as that user or refuses with ``ctx: ERRNO: …`` and what to do,
never with a Python traceback; tools run as that uid with no capability and, without a
network grant, in a network namespace of their own; files made are the user's, with the
documented modes.  (The first steps of the same journey, the refusals of what needs root and
a FUSE mount of both views, are the subject of test_acceptance_flows_nonroot.py.)"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    alive,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to switch to the unprivileged test user"
)

SCRATCH = scratch_top(__file__)
VENV_BIN = Path(CTX_ARGV[0]).parent
CTXMCP = VENV_BIN / "ctxmcp"
MCP_TIME = VENV_BIN / "mcp-server-time"
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
TRACEBACK = "Traceback (most recent call last)"
WAIT = 20.0  # seconds: the bound of every wait (only a hang reaches it)
# A tool call that says whether 127.0.0.1:PORT answers from inside the tool.
CONNECT = (
    "python3 -c 'import socket,sys\n"
    "try:\n"
    '    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)\n'
    '    print("connected")\n'
    "except OSError as e:\n"
    '    print("refused", e.errno)\' {port}'
)


# ------------------------------------------------------------------------------ the owner


@dataclass
class Owner:
    """The test user at a machine of their own: a home below a scratch directory, ``ctx`` run
    as that user (groups: ``groups``) from a login-like environment without XDG settings."""

    user: UnprivilegedUser
    top: Path
    home: Path
    groups: tuple[int, ...] = ()

    @property
    def uid(self) -> int:
        return self.user.uid

    @property
    def gid(self) -> int:
        return self.user.gid

    @property
    def root(self) -> Path:
        """R-1: with XDG_DATA_HOME unset, ``~/.local/share/cortexfs/storage/current``."""
        return self.home / ".local" / "share" / "cortexfs" / "storage" / "current"

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": f"{VENV_BIN}:{PATH}",
            "HOME": str(self.home),
            "USER": self.user.name,
            "LOGNAME": self.user.name,
            "LANG": "C.UTF-8",
        }
        env.update(extra)
        return {k: v for k, v in env.items() if v is not None}

    def run(
        self,
        argv: list[str],
        *,
        stdin: str = "",
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        groups: tuple[int, ...] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv,
            input=stdin,
            user=self.uid,
            group=self.gid,
            extra_groups=list(self.groups if groups is None else groups),
            umask=0o022,
            env=env or self.env(),
            cwd=cwd or self.home,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert TRACEBACK not in done.stderr, done
        return done

    def ctx(self, *args: str | os.PathLike, **kw) -> subprocess.CompletedProcess[str]:
        return self.run([*CTX_ARGV, *map(str, args)], **kw)

    def popen(self, argv: list[str], out: Path, **kw) -> subprocess.Popen:
        """``argv`` started as the user in the background, its output in ``out`` and
        ``out``.err."""
        with open(out, "w") as stdout, open(f"{out}.err", "w") as stderr:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                user=self.uid,
                group=self.gid,
                extra_groups=list(self.groups),
                umask=0o022,
                env=self.env(),
                cwd=self.home,
                **kw,
            )

    def sh(self, script: str, *args: str | os.PathLike, **kw) -> subprocess.CompletedProcess:
        return self.run(["/bin/sh", "-c", script, "sh", *map(str, args)], **kw)

    def write(self, path: Path, text: str, mode: int = 0o644) -> Path:
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        done = self.sh(script, path, f"{mode:o}", stdin=text)
        assert done.returncode == 0, done.stderr
        return path

    def append(self, path: Path, line: str) -> None:
        done = self.sh('printf "%s\\n" "$2" >> "$1"', path, line)
        assert done.returncode == 0, done.stderr

    def bootstrap(self) -> None:
        done = self.ctx("bootstrap")
        assert done.returncode == 0, done

    def agent(self, name: str, tools: list[str], *options: str, **extra) -> dict:
        request = {"name": name, "label": f"{name}_t", "tools": tools, **extra}
        made = self.ctx("agent", "create", "--json", *options, "-", stdin=json.dumps(request))
        assert made.returncode == 0, made
        return json.loads(made.stdout)

    def allow(self, label: str, tool: str) -> None:
        """The tool's own half of P-6, written by the user, whose policy it is."""
        self.append(
            self.root / "tool" / f"{tool}.d" / "policy", f"allow {label} tool:{tool} execute"
        )

    def strangers(self) -> list[str]:
        """Every entry below the home (never following links) that is not the user's."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.home):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                info = path.lstat()
                if info.st_uid != self.uid:
                    found.append(f"{path} ({info.st_uid}:{info.st_gid})")
        return found


def _owner(groups: tuple[int, ...] = ()) -> Iterator[Owner]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "u")
    home = top / "home"
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    try:
        yield Owner(user, top, home, groups)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def owner() -> Iterator[Owner]:
    yield from _owner()


@pytest.fixture
def grouped_owner() -> Iterator[Owner]:
    """The owner, whose processes hold a supplementary group besides their own."""
    yield from _owner((other_group(find_or_create_user()),))


def other_group(user: UnprivilegedUser) -> int:
    """A group that is not the user's primary one (``users`` where there is one)."""
    with contextlib.suppress(KeyError):
        gid = grp.getgrnam("users").gr_gid
        if gid != user.gid:
            return gid
    return next(g for g in (100, 60, 50) if g != user.gid)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def frames(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def result_of(done: subprocess.CompletedProcess[str]) -> dict:
    """The ``result`` frame of a native ``ctx run``."""
    found = [f for f in frames(done.stdout) if f.get("type") == "result"]
    assert len(found) == 1, done
    return found[0]


@contextlib.contextmanager
def listener() -> Iterator[int]:
    """A TCP socket listening on 127.0.0.1 of the host; its port."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


# ------------------------------------------------------------------------------ the flows


def test_the_readme_journey_as_an_ordinary_user_ends_with_an_mcp_tool_run_as_that_user(
    owner: Owner,
) -> None:
    """R-1, R-5, A-3, P-6, T-3, M-1, M-4, T-8, README: with HOME only, bootstrap makes the root
    under ``~/.local/share`` (the XDG directories 0700); the agent the user creates runs as the
    user (no ``default_user``), its controls the user's; the tool call, ``ctxmcp project`` and
    ``ctx object install`` of a candidate all work as the user, and the projected tool runs
    as the user's uid once both policies hold the rule."""
    boot = owner.ctx("bootstrap")
    assert boot.returncode == 0, boot
    assert boot.stdout.splitlines()[0] == f"storage root: {owner.root}", boot.stdout
    assert set(os.listdir(owner.root)) == ROOT_ENTRIES
    assert mode(owner.home / ".local") == mode(owner.home / ".local" / "share") == 0o700
    assert {mode(owner.root / e) for e in ROOT_ENTRIES} | {mode(owner.root)} == {0o755}

    first = owner.home / "ctx-first"
    for sub in ("workspace", "mcp"):
        owner.sh('mkdir -p "$1"', first / sub)
    owner.write(first / "mcp" / "mcp.json",
                json.dumps({"mcpServers": {"time": {"command": str(MCP_TIME)}}}))  # fmt: skip
    request = {"name": "coder", "label": "coder_t", "tools": ["fs.stat"],
               "mount": [[str(first / "workspace"), "/workspace", "rw"],
                         [str(first / "mcp"), "/mcp", "ro"]]}  # fmt: skip
    owner.write(first / "request.json", json.dumps(request))
    made = owner.ctx("agent", "create", "request.json", "--json", cwd=first)
    assert made.returncode == 0, made
    facts = json.loads(made.stdout)
    assert facts["identity"] == {"uid": owner.uid, "gid": owner.gid, "groups": []}, facts
    assert facts["default_user"] is None and facts["warnings"] == [], facts
    controls = owner.root / "agent" / "coder.d"
    for control in controls.iterdir():
        info = control.lstat()
        wanted = 0o640 if control.name == "log" else 0o644
        assert (info.st_uid, mode(control)) == (owner.uid, wanted), control
    assert mode(controls) == 0o755 and mode(owner.root / "agent" / "coder") == 0o755

    which = owner.ctx("object", "which", "fs.stat")
    assert which.stdout == f"{owner.root}/tool/fs.stat\n", which
    owner.append(Path(f"{which.stdout.strip()}.d/policy"), "allow coder_t tool:fs.stat execute")
    ran = owner.ctx("run", "--agent", "coder", "fs.stat", "/workspace", cwd=first)
    assert ran.returncode == 0, ran
    assert "type: directory" in ran.stdout and f"uid: {owner.uid}" in ran.stdout, ran

    projected = owner.run([str(CTXMCP), "project", "--config", "mcp/mcp.json",
                           "--runtime-config", "/mcp/mcp.json", "--server", "time",
                           "--out", "candidates/"], cwd=first)  # fmt: skip
    assert projected.returncode == 0, projected
    candidate = first / "candidates" / "time.get_current_time.manifest.json"
    assert candidate.is_file() and candidate.stat().st_uid == owner.uid
    assert set(os.listdir(owner.root)) == ROOT_ENTRIES  # M-1: nothing written under the root
    installed = owner.ctx("object", "install", candidate, "--tier", "system", cwd=first)
    assert installed.returncode == 0, installed
    tool = owner.root / "tool" / "time.get_current_time"
    assert tool.stat().st_uid == owner.uid
    locator = json.loads((Path(f"{tool}.d") / "mcp").read_text())
    assert locator == {"config": "/mcp/mcp.json", "server": "time", "tool": "get_current_time",
                       "transport": "stdio"}  # fmt: skip

    rule = "allow coder_t tool:time.get_current_time execute"
    refused = owner.ctx("run", "--agent", "coder", "--native", "time.get_current_time",
                        stdin='{"timezone": "UTC"}')  # fmt: skip
    assert refused.returncode == 1 and result_of(refused)["error"]["error"] == "EACCES"
    owner.append(controls / "policy", rule)
    owner.allow("coder_t", "time.get_current_time")
    called = owner.ctx("run", "--agent", "coder", "--native", "time.get_current_time",
                       stdin='{"timezone": "UTC"}')  # fmt: skip
    assert called.returncode == 0, called
    output = result_of(called)["output"]
    assert output["isError"] is False and output["structuredContent"]["timezone"] == "UTC"
    session = owner.root / "home" / str(owner.uid) / "agent" / "coder" / "session" / "default"
    assert mode(owner.root / "home" / str(owner.uid)) == 0o755
    assert {mode(session), mode(session.parent), mode(session / "events.jsonl")} == {0o700, 0o600}
    manual = owner.ctx("man", "tool")
    assert manual.returncode == 0 and manual.stdout.startswith("# ctx.tool"), manual
    assert owner.strangers() == []


def test_a_workspace_that_holds_the_users_own_root_is_warned_of_and_every_call_refused(
    owner: Owner,
) -> None:
    """README ("coder's workspace: not ~ itself, which holds the storage root (coder could
    rewrite its own controls, so every call it makes is refused)"), policy step 4: the create
    warns and names the remedy; every call is EACCES at step 4, nothing runs."""
    owner.bootstrap()
    made = owner.agent("homey", ["shell.exec"], mount=[[str(owner.home), "/workspace", "rw"]])
    assert len(made["warnings"]) == 1, made
    assert "step 4" in made["warnings"][0] and "make this mount 'ro'" in made["warnings"][0]
    owner.allow("homey_t", "shell.exec")
    marker = owner.home / "ran"
    called = owner.ctx("run", "--agent", "homey", "shell.exec", f"touch {marker}")
    assert called.returncode == 126 and called.stdout == "", called
    assert called.stderr.startswith("ctx: EACCES: step 4 (agent label): "), called
    assert not marker.exists()


def test_without_a_network_grant_the_users_tool_cannot_reach_the_hosts_loopback(
    owner: Owner,
) -> None:
    """P-4, docs/tools.md "Network (P-4)" and "Identity": a non-root host starts the tool in a
    user and network namespace of its own: 127.0.0.1 of the host is ENETUNREACH, the tool is
    the user's uid with no capability; with ``network:default connect`` it connects."""
    owner.bootstrap()
    owner.agent("net", ["shell.exec"])
    owner.allow("net_t", "shell.exec")
    with listener() as port:
        cmd = CONNECT.format(port=port) + "; grep CapEff /proc/self/status; id -u"
        offline = owner.ctx("run", "--agent", "net", "shell.exec", cmd)
        assert offline.returncode == 0, offline
        lines = offline.stdout.split("\n")
        assert lines[0] == "refused 101", offline  # ENETUNREACH
        assert lines[1].split() == ["CapEff:", "0000000000000000"], offline
        assert lines[2] == str(owner.uid), offline
        owner.append(
            owner.root / "agent" / "net.d" / "policy", "allow net_t network:default connect"
        )
        online = owner.ctx("run", "--agent", "net", "shell.exec", CONNECT.format(port=port))
        assert (online.returncode, online.stdout) == (0, "connected\n"), online


def test_a_host_whose_user_namespaces_fail_refuses_offline_calls_and_workers_before_running(
    owner: Owner,
) -> None:
    """P-4, W-1, docs/workers.md ("a non-root host without user namespaces … refused so too,
    with the EACCES each call would have met"): with ``unshare`` failing, a call of an agent
    without the network grant is EACCES (126; native: stage ``run``) and runs nothing, one with
    the grant runs, and a worker for the first agent exits 1 naming it, no job claimed."""
    owner.bootstrap()
    owner.ctx("queue", "init", "--project", "p")
    owner.agent("cut", ["shell.exec"], shared={"p": ["read", "write"]})
    owner.agent("wired", ["shell.exec"])
    owner.append(
        owner.root / "agent" / "wired.d" / "policy", "allow wired_t network:default connect"
    )
    for label in ("cut_t", "wired_t"):
        owner.allow(label, "shell.exec")
    fake = owner.home / "bin"
    owner.write(fake / "unshare",
                "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n",
                mode=0o755)  # fmt: skip
    env = owner.env(PATH=f"{fake}:{VENV_BIN}:{PATH}")
    marker = owner.home / "ran"

    terminal = owner.ctx("run", "--agent", "cut", "shell.exec", f"touch {marker}", env=env)
    assert terminal.returncode == 126 and terminal.stdout == "", terminal
    assert terminal.stderr.startswith("ctx: EACCES: the agent may not use the network"), terminal
    assert "Operation not permitted" in terminal.stderr, terminal
    native = owner.ctx("run", "--agent", "cut", "--native", "shell.exec", env=env,
                       stdin=json.dumps({"cmd": f"touch {marker}"}))  # fmt: skip
    assert native.returncode == 1, native
    error = result_of(native)["error"]
    assert (error["error"], error["stage"]) == ("EACCES", "run"), error
    assert not marker.exists()
    wired = owner.ctx("run", "--agent", "wired", "shell.exec", "echo online", env=env)
    assert (wired.returncode, wired.stdout) == (0, "online\n"), wired

    job = json.dumps({"tool": "shell.exec", "input": {"cmd": f"touch {marker}"}})
    owner.ctx("queue", "publish", "--project", "p", "--name", "j", "-", stdin=job)
    worker = owner.ctx("queue", "work", "--project", "p", "--agent", "cut", "--drain", env=env)
    assert worker.returncode == 1, worker
    assert worker.stderr.startswith("ctx: EACCES: the agent may not use the network"), worker
    assert worker.stderr.rstrip().endswith("no job was claimed"), worker
    queue = owner.root / "shared" / "p" / "queue"
    assert os.listdir(queue / "pending") == ["j.req.json"] and not marker.exists()
    assert os.listdir(queue / "claimed") == os.listdir(queue / "lease") == []


def test_the_users_groups_go_to_their_agent_and_a_group_it_lacks_stops_calls_and_workers(
    grouped_owner: Owner,
) -> None:
    """A-3 identity, P-5 step 1, docs/tools.md ("A storage owner who is not root … cannot drop
    groups"): an agent created by a user holding a supplementary group gets it, and its tool
    reads a file only that group may read; an agent given fewer groups is refused, terminal
    call and worker alike (EACCES naming the group, no job claimed); ``--groups`` of a group
    the user lacks is EPERM."""
    owner = grouped_owner
    (extra,) = owner.groups
    owner.bootstrap()
    owner.ctx("queue", "init", "--project", "p")
    full = owner.agent("full", ["shell.exec"])
    assert full["identity"] == {"uid": owner.uid, "gid": owner.gid, "groups": [extra]}
    lean = owner.agent("lean", ["shell.exec"], "--groups", "", shared={"p": ["read", "write"]})
    assert lean["identity"]["groups"] == [], lean
    for label in ("full_t", "lean_t"):
        owner.allow(label, "shell.exec")
    secret = owner.top / "secret"
    secret.write_text("for the group\n")
    os.chown(secret, 0, extra)
    secret.chmod(0o040)

    read = owner.ctx("run", "--agent", "full", "shell.exec", f"cat {secret}")
    assert (read.returncode, read.stdout) == (0, "for the group\n"), read
    refused = owner.ctx("run", "--agent", "lean", "shell.exec", f"cat {secret}")
    assert refused.returncode == 126 and refused.stdout == "", refused
    assert refused.stderr.startswith(f"ctx: EACCES: this process holds group {extra}, "), refused
    assert "which agent 'lean' is not given" in refused.stderr, refused

    job = json.dumps({"tool": "shell.exec", "input": {"cmd": "true"}})
    owner.ctx("queue", "publish", "--project", "p", "--name", "j", "-", stdin=job)
    worker = owner.ctx("queue", "work", "--project", "p", "--agent", "lean", "--drain")
    assert worker.returncode == 1 and "no job was claimed" in worker.stderr, worker
    pending = owner.root / "shared" / "p" / "queue" / "pending"
    assert os.listdir(pending) == ["j.req.json"]
    # From a session without the extra group, the lean agent is the user's exactly.
    alone = owner.ctx("run", "--agent", "lean", "shell.exec", "id -u", groups=())
    assert (alone.returncode, alone.stdout) == (0, f"{owner.uid}\n"), alone

    foreign = next(g for g in (0, 4, 42) if g not in (extra, owner.gid))
    other = owner.ctx("agent", "create", "--groups", str(foreign), "-",
                      stdin=json.dumps({"name": "x", "label": "x_t", "tools": []}))  # fmt: skip
    assert other.returncode == 1, other
    assert other.stderr.startswith(f"ctx: EPERM: only root can create an agent that runs "
                                   f"as group {foreign}"), other  # fmt: skip
    assert not (owner.root / "agent" / "x").exists()
    assert owner.strangers() == []


def test_a_users_killed_worker_takes_its_tool_along_and_recover_then_a_drain_finish_it(
    owner: Owner,
) -> None:
    """W-1, W-4, Q-5, I-3, docs/workers.md (parent-death signal and orphan guard), §3: as the
    user, a worker SIGKILLed while its tool runs leaves no tool process behind (the tool runs
    through the user's own namespace prefix); ``recover`` requeues the job, a drain worker runs
    it once more to done; a long-running worker stops cleanly on SIGTERM (exit 0); every file
    of the queue and of the worker's session is the user's."""
    owner.bootstrap()
    owner.ctx("queue", "init", "--project", "p")
    owner.agent("w", ["shell.exec"], shared={"p": ["read", "write"]})
    owner.allow("w_t", "shell.exec")
    pidfile, second = owner.home / "tool.pid", owner.home / "second"
    cmd = (
        f"if [ -e {pidfile} ]; then touch {second}; echo again; "
        f"else echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300; fi"
    )
    job = json.dumps({"tool": "shell.exec", "input": {"cmd": cmd}})
    published = owner.ctx("queue", "publish", "--project", "p", "--name", "slow", "-", stdin=job)
    assert published.stdout == "slow.req.json\n", published
    queue = owner.root / "shared" / "p" / "queue"

    worker = owner.popen([*CTX_ARGV, "queue", "work", "--project", "p", "--agent", "w"],
                         owner.top / "first")  # fmt: skip
    try:
        assert wait_for(pidfile.exists, WAIT), "the job's tool never started"
        tool_pid = int(pidfile.read_text())
        assert alive(tool_pid) and os.stat(f"/proc/{tool_pid}").st_uid == owner.uid
        lease = json.loads((queue / "lease" / "slow.req.json" / "worker").read_text())
        assert lease["pid"] == worker.pid, lease
        worker.kill()
        worker.wait()
        assert wait_for(lambda: not alive(tool_pid), WAIT), "the tool outlived its worker"
    finally:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        worker.wait()

    recovered = owner.ctx("queue", "recover", "--project", "p", "--json")
    assert recovered.returncode == 0, recovered
    report = json.loads(recovered.stdout)
    assert [(r["job"], r["applied"]) for r in report["requeued"]] == [("slow.req.json", True)]
    drained = owner.ctx("queue", "work", "--project", "p", "--agent", "w", "--drain")
    assert drained.returncode == 0, drained
    outcome = json.loads((queue / "done" / "slow.req.json.result").read_text())
    assert outcome["status"] == "ok" and outcome["output"] == "again\n", outcome
    assert second.exists()

    waiting = owner.popen([*CTX_ARGV, "queue", "work", "--project", "p", "--agent", "w",
                           "--json"], owner.top / "waiting")  # fmt: skip
    worker_pid = waiting.pid
    try:
        started = lambda: '"event": "start"' in (owner.top / "waiting").read_text()  # noqa: E731
        assert wait_for(started, WAIT), "the waiting worker never started"
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(timeout=WAIT) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker_pid, signal.SIGKILL)
    stop = frames((owner.top / "waiting").read_text())[-1]
    assert (stop["event"], stop["stopped_by"], stop["left_claimed"]) == ("stop", "SIGTERM", [])
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert os.listdir(queue / sub) == [], sub
    assert {mode(queue / sub) for sub in QUEUE_SUBDIRS} == {0o2770}
    events = owner.root / "home" / str(owner.uid) / "agent" / "w" / "session" / "worker"
    assert mode(events) == 0o700 and mode(events / "events.jsonl") == 0o600
    assert owner.strangers() == []


def test_the_users_agent_creates_a_child_and_updates_its_prompt_as_the_user(owner: Owner) -> None:
    """A-4, A-5, docs/tools.md ("the child runs as the caller's uid, gid and groups"): on the
    user's root, ``agent.create`` needs ``agent:<child> create`` (EACCES without it, nothing
    made), then makes a child running as the user whose controls are the user's;
    ``agent.update`` replaces the caller's ``system.md`` and refuses its policy (EINVAL)."""
    owner.bootstrap()
    owner.agent("boss", ["agent.create", "agent.update", "shell.exec"])
    for tool in ("agent.create", "agent.update", "shell.exec"):
        owner.allow("boss_t", tool)
    child = json.dumps({"name": "kid", "label": "kid_t", "tools": ["shell.exec"]})
    denied = owner.ctx("run", "--agent", "boss", "--native", "agent.create", stdin=child)
    assert denied.returncode == 1 and result_of(denied)["error"]["error"] == "EACCES", denied
    assert not (owner.root / "agent" / "kid").exists()

    owner.append(owner.root / "agent" / "boss.d" / "policy", "allow boss_t agent:kid create")
    made = owner.ctx("run", "--agent", "boss", "--native", "agent.create", stdin=child)
    assert made.returncode == 0, made
    assert result_of(made)["output"]["uid"] == owner.uid, made
    identity = json.loads((owner.root / "agent" / "kid.d" / "identity").read_text())
    assert identity == {"uid": owner.uid, "gid": owner.gid, "groups": []}
    owner.allow("kid_t", "shell.exec")
    ran = owner.ctx("run", "--agent", "kid", "shell.exec", "id -u")
    assert (ran.returncode, ran.stdout) == (0, f"{owner.uid}\n"), ran

    update = json.dumps({"control": "system.md", "content": "Be brief.\n"})
    updated = owner.ctx("run", "--agent", "boss", "--native", "agent.update", stdin=update)
    assert updated.returncode == 0, updated
    system = owner.root / "agent" / "boss.d" / "system.md"
    assert system.read_text() == "Be brief.\n" and mode(system) == 0o644
    policy = owner.root / "agent" / "boss.d" / "policy"
    before = policy.read_text()
    grab = json.dumps({"control": "policy", "content": "allow boss_t network:default connect\n"})
    refused = owner.ctx("run", "--agent", "boss", "--native", "agent.update", stdin=grab)
    assert refused.returncode == 2 and result_of(refused)["error"]["error"] == "EINVAL", refused
    assert policy.read_text() == before
    assert owner.strangers() == []


def test_after_root_bootstraps_the_users_root_the_owner_still_administers_it(owner: Owner) -> None:
    """docs/tools.md "Root bootstrapping another uid's root" ("that owner administers the
    root"), H-4 ("Only the tier's owner (and root) may update it: the file belongs to the
    storage root's owner"): the user makes the empty root, root bootstraps it, and the user
    then installs a tool, creates an agent, makes a queue — and updates tsh's configuration,
    or, refused, is told who may (not sent back to the command just refused)."""
    made = owner.sh('mkdir -p "$1"', owner.root)
    assert made.returncode == 0, made
    boot = subprocess.run([*CTX_ARGV, "bootstrap", "--storage", str(owner.root)],
                          env={"PATH": PATH, "LANG": "C.UTF-8"}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert boot.returncode == 0, boot
    assert {(owner.root / e).stat().st_uid for e in ROOT_ENTRIES} == {owner.uid}

    src = owner.home / "src"
    owner.write(src / "hi.sh", "#!/bin/sh\necho hi\n", mode=0o755)
    owner.write(src / "hi.json", json.dumps({
        "manifest": 2, "kind": "tool", "name": "hi", "description": "Say hi.",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "hi.sh"}))  # fmt: skip
    installed = owner.ctx("object", "install", src / "hi.json", "--tier", "system")
    assert installed.returncode == 0, installed
    owner.agent("c", ["hi"])
    owner.allow("c_t", "hi")
    ran = owner.ctx("run", "--agent", "c", "hi")
    assert (ran.returncode, ran.stdout) == (0, "hi\n"), ran
    assert owner.ctx("queue", "init", "--project", "q").returncode == 0

    config = owner.root / "tool" / "tsh.d" / "config"
    updated = owner.ctx("tool", "tsh.config", "max_loaded_tools=10")
    if updated.returncode == 0:
        assert "max_loaded_tools=10" in config.read_text().splitlines()
    else:
        assert updated.stderr.startswith("ctx: EACCES: "), updated
        assert "belongs to the storage root's owner" not in updated.stderr, updated
        assert "root" in updated.stderr.split("Permission denied", 1)[-1], updated


def test_the_users_own_fuse_mount_writes_as_the_user_and_umount_without_a_mountpoint_ends_it(
    owner: Owner,
) -> None:
    """F-1, R-2, docs/mount.md ("A file or directory made through the mount gets the mode asked
    for less the caller's umask"; ``ctx umount`` without MOUNTPOINT unmounts the caller's one
    mount, none is ENOENT): as the user, with a /dev/fuse the user may open (given in a private
    mount namespace where the host's is 0600) and setuid fusermount3, a file and a directory
    made in a space's ``data/`` through the mount are the user's on disk with the caller's
    umask applied; a new root entry is EACCES; ``ctx umount`` ends it, the mount exits 0, and
    a second ``ctx umount`` is ENOENT."""
    fusermount = shutil.which("fusermount3")
    if fusermount is None or not os.stat(fusermount).st_mode & stat.S_ISUID:
        pytest.skip("needs a setuid-root fusermount3")
    if not os.path.exists("/dev/fuse") or shutil.which("unshare") is None:
        pytest.skip("needs /dev/fuse and util-linux unshare")
    owner.bootstrap()
    assert owner.ctx("shared", "create", "p").returncode == 0
    out = owner.top / "out"
    out.mkdir(mode=0o700)
    os.chown(out, owner.uid, owner.gid)
    dev = owner.top / "dev"
    dev.mkdir(mode=0o755)
    script = """
    out=$1; cd "$HOME"; umask 027; mkdir mnt
    ctx mount mnt > "$out/mount.out" 2> "$out/mount.err" & pid=$!
    for i in $(seq 400); do grep -q " $HOME/mnt " /proc/self/mountinfo && break; sleep 0.05; done
    echo hello > mnt/shared/p/data/f.txt; echo $? > "$out/write"
    mkdir mnt/shared/p/data/dd; echo $? > "$out/mkdir"
    mkdir mnt/extra 2> "$out/extra.err"; echo $? > "$out/extra"
    ctx umount > "$out/umount.out" 2>&1; echo $? > "$out/umount"
    wait $pid; echo $? > "$out/status"
    ctx umount > "$out/again.out" 2>&1; echo $? > "$out/again"
    """
    namespace = """
    set -e; dev=$1; shift
    mount -t tmpfs -o size=16k,mode=0755 cortexfs-test-dev "$dev"
    mknod -m 0666 "$dev/fuse" c 10 229
    mount --bind "$dev/fuse" /dev/fuse
    exec "$@"
    """
    env = [f"{k}={v}" for k, v in owner.env().items()]
    as_user = ["setpriv", f"--reuid={owner.uid}", f"--regid={owner.gid}", "--clear-groups",
               "env", "-i", *env, "/bin/sh", "-c", script, "sh", str(out)]  # fmt: skip
    argv = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", namespace, "sh",
            str(dev), *as_user]  # fmt: skip
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=45)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if proc.returncode != 0 and "mknod" in err:
        pytest.skip(f"cannot give /dev/fuse the distributions' mode here: {err.strip()}")
    assert proc.returncode == 0, err

    def read(name: str) -> str:
        return (out / name).read_text()

    mount_log = read("mount.out") + read("mount.err")
    assert TRACEBACK not in mount_log, mount_log
    assert (read("write"), read("mkdir"), read("extra")) == ("0\n", "0\n", "1\n"), mount_log
    assert "Permission denied" in read("extra.err")
    data = owner.root / "shared" / "p" / "data"
    assert (data / "f.txt").read_text() == "hello\n"
    assert (data / "f.txt").stat().st_uid == (data / "dd").stat().st_uid == owner.uid
    assert mode(data / "f.txt") == 0o640, oct(mode(data / "f.txt"))
    assert mode(data / "dd") & 0o777 == 0o750, oct(mode(data / "dd"))
    assert (read("umount"), read("status")) == ("0\n", "0\n"), (read("umount.out"), mount_log)
    assert read("again") == "1\n" and read("again.out").startswith("ctx: ENOENT: "), read(
        "again.out"
    )
    assert set(os.listdir(owner.root)) == ROOT_ENTRIES
    assert not os.path.ismount(owner.home / "mnt")
    assert owner.strangers() == []


def test_a_home_the_user_cannot_make_and_a_relative_xdg_data_home_are_answered_plainly(
    owner: Owner,
) -> None:
    """R-1, docs/spec/ctx.root-abi.md ("when XDG_DATA_HOME is unset or not an absolute path"):
    a relative XDG_DATA_HOME is ignored (the root goes under ``~/.local/share``, nothing is made
    in the working directory); with HOME unset the password database's home counts, and where
    the user may not make it, bootstrap is EACCES naming it and the remedy, and a command that
    needs the root is ENOENT pointing at ``ctx bootstrap`` — never a traceback."""
    work = owner.home / "here"
    owner.sh('mkdir -p "$1"', work)
    relative = owner.ctx("bootstrap", env=owner.env(XDG_DATA_HOME="data"), cwd=work)
    assert relative.returncode == 0, relative
    assert relative.stdout.splitlines()[0] == f"storage root: {owner.root}", relative
    assert os.listdir(work) == []

    home = Path(pwd.getpwuid(owner.uid).pw_dir or "/")
    if home.exists() or owner.sh('test -w "$1" -a -x "$1"', home.parent).returncode == 0:
        pytest.skip(f"the password database's home of the test user, {home}, can be used")
    no_home = {k: v for k, v in owner.env().items() if k != "HOME"}
    boot = owner.ctx("bootstrap", env=no_home, cwd=work)
    assert boot.returncode == 1 and boot.stdout == "", boot
    assert boot.stderr.startswith(f"ctx: EACCES: cannot create {home} "), boot
    assert "--storage DIR or CTX_STORAGE" in boot.stderr, boot
    listed = owner.ctx("agent", "list", env=no_home, cwd=work)
    assert listed.returncode == 1, listed
    assert listed.stderr.startswith("ctx: ENOENT: storage root "), listed
    assert "'ctx bootstrap'" in listed.stderr, listed
    assert os.listdir(work) == []
