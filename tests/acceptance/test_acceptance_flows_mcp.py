"""End-to-end flows of a user who adopts an MCP server's tools (SPEC §10 with §2, §3, §4, §6,
§13): ``ctxmcp list`` and ``ctxmcp project`` of a server written with the MCP SDK (and of the
published ``mcp-server-time``), ``ctx object check``/``install`` into a shared tier and a
user's own tier, the two policy layers, calls through ``ctx run --agent`` in both modes,
through ``ctx queue work`` draining jobs that name the projected tool and through a file of
``ctx mount --as AGENT``; then the life of it: the server's configuration gains and drops
tools, the server prints a banner on stdout, crashes mid-call, hangs past the timeout or its
program is removed, and the tool is projected and installed again.

The single claims of §10 are checked one by one in test_acceptance_mcp*.py and tests/mcp/;
test_acceptance_flows_agents.py runs the time server from the system tier.  Black-box: the
installed ``ctx`` and ``ctxmcp``, real processes, uids and FUSE mounts."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    ROOT_ENTRIES,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_mount,
    needs_fuse,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
VENV_BIN = REPO / ".venv" / "bin"
CTX = VENV_BIN / "ctx"
CTXMCP = VENV_BIN / "ctxmcp"
PYTHON = VENV_BIN / "python"
TIME_SERVER = VENV_BIN / "mcp-server-time"
SECRET = "sk-flows-mcp-7f3a91-never-copied"
LABEL = "coder_t"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")
pytestmark = [
    needs_root,
    pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv"),
]

# A stdio server written with the MCP SDK.  Its command line chooses its tools
# (``--tools add,sub``; ``add+`` is the later ``add`` that takes an optional third number) and
# ``--banner`` makes it print a line on stdout before it serves, as a chatty server does.  It
# needs the token its configuration gives it in CALC_TOKEN, as a real API server does.
CALC_SERVER = r"""
import os, sys, time
from mcp.server.mcpserver import MCPServer

args = sys.argv[1:]
chosen = args[args.index("--tools") + 1].split(",") if "--tools" in args else ["add"]
if "--banner" in args:
    print("calc server starting (verbose)", flush=True)

def token():
    if not os.environ.get("CALC_TOKEN", "").startswith("sk-"):
        raise ValueError("no CALC_TOKEN in the environment")

def add(a: int, b: int) -> int:
    token()
    return a + b

def add3(a: int, b: int, c: int = 0) -> int:
    token()
    return a + b + c

def sub(a: int, b: int) -> int:
    return a - b

def mul(a: int, b: int) -> int:
    return a * b

def act(how: str) -> str:
    if how == "crash":  # as a server that dumps its settings on a fatal error does
        print(f"fatal: CALC_TOKEN={os.environ.get('CALC_TOKEN')} was refused", file=sys.stderr)
        sys.stderr.flush()
        os._exit(9)
    if how == "hang":
        time.sleep(3600)
    return "fine"

TOOLS = {
    "add": (add, "Add two integers."),
    "add+": (add3, "Add two or three integers."),
    "sub": (sub, "Subtract b from a."),
    "mul": (mul, "Multiply two integers."),
    "act": (act, "Behave as asked: fine, crash or hang."),
}
server = MCPServer("calc")
for spec in chosen:
    function, text = TOOLS[spec]
    server.add_tool(function, name=spec.rstrip("+"), description=text)
server.run("stdio")
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host(OnStorage):
    """The administrator's machine: a directory every uid may search, holding a bootstrapped
    storage root and ``mcp/``, the host-owned configuration directory (agents mount it
    read-only at the same path, so the locator's path is the one they and a person see)."""

    top: Path
    storage: Path
    mcp: Path

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    def configure(self, server: str = "calc", *args: str, command: Path | None = None) -> None:
        """(Re)write the configuration: ``server`` runs the calc server with ``args``, and
        gets the secret token in its environment."""
        entry = {
            "command": str(command or self.mcp / "bin" / "calc-server"),
            "args": list(args),
            "env": {"CALC_TOKEN": SECRET},
        }
        self.config.write_text(json.dumps({"mcpServers": {server: entry}}))
        self.config.chmod(0o644)

    def ctxmcp(self, *args: str | os.PathLike) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              timeout=90, env=self.env)  # fmt: skip

    def project(self, out: Path, server: str = "calc", *extra: str):
        return self.ctxmcp(
            "project", "--config", self.config, "--runtime-config", self.config,
            "--server", server, "--out", out, *extra,
        )  # fmt: skip

    def install(self, manifest: Path, tier: str) -> Run:
        done = self.ctx("object", "install", manifest, "--tier", tier)
        assert done.rc == 0, done
        return done

    def agent(self, name: str, tools: list[str], **extra) -> int:
        req = {"name": name, "label": LABEL, "tools": tools,
               "mount": [[str(self.mcp), str(self.mcp), "ro"]], **extra}  # fmt: skip
        made = self.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        assert made.rc == 0, made
        return made.json()["identity"]["uid"]

    def native(self, tool: str, payload: dict, *opts: str) -> tuple[Run, dict]:
        ran = self.ctx("run", "--agent", "coder", "--native", *opts, tool,
                       input=json.dumps(payload))  # fmt: skip
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return ran, frames[-1]

    def drain(self, project: str, *opts: str) -> tuple[Run, list[dict]]:
        ran = self.ctx("queue", "work", "--project", project, "--agent", "coder", "--drain",
                       "--json", *opts, timeout=90)  # fmt: skip
        return ran, [json.loads(line) for line in ran.lines() if line.strip()]


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "host-")
    try:
        storage = top / "storage"
        copy_of_root(_template, storage)
        mcp = top / "mcp"
        (mcp / "bin").mkdir(parents=True, mode=0o755)
        mcp.chmod(0o755)
        (mcp / "calc_server.py").write_text(CALC_SERVER)
        (mcp / "calc_server.py").chmod(0o644)
        launcher = mcp / "bin" / "calc-server"
        launcher.write_text(f'#!/bin/sh\nexec {PYTHON} {mcp / "calc_server.py"} "$@"\n')
        launcher.chmod(0o755)
        yield Host(top, storage, mcp)
    finally:
        kill_servers(top)
        shutil.rmtree(top, ignore_errors=True)


def servers_of(top: Path) -> list[int]:
    """Pids of the live processes whose command line names a file under ``top``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(top).encode() in argv and state != "Z" and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def kill_servers(top: Path) -> None:
    for pid in servers_of(top):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def events(storage: Path, uid: int, agent: str, session: str) -> list[dict]:
    return read_jsonl(storage / "home" / str(uid) / "agent" / agent / "session" / session /
                 "events.jsonl")  # fmt: skip


def results_for(records: list[dict], tool_path: str) -> list[dict]:
    return [e for e in records if e["type"] == "tool_result" and e["object"] == tool_path]


def allow(policy: Path, tool: str) -> None:
    with policy.open("a") as file:
        file.write(f"allow {LABEL} tool:{tool} execute\n")


def job(tool: str, payload: dict) -> dict:
    req = request(tool)
    req["input"] = payload
    return req


def every_file(*tops: Path) -> Iterator[tuple[Path, bytes]]:
    for top in tops:
        for path in top.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path, path.read_bytes()


def nobody_gid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_gid
    except KeyError:
        pytest.skip("no user nobody: root's default agent user")


# ================================================================ adoption, shared tier


def test_flow_sdk_server_projected_into_a_shared_tier_and_called_three_ways(host: Host) -> None:
    """M-1, M-3, M-4, T-8, P-6, T-3, T-7, S-2, W-1: ``ctxmcp list``/``project`` of an SDK
    server write candidates and nothing under the root (no grant, no ``mcp/``); the checked
    candidate installed into the shared space ``lab`` is refused until its own policy names
    the label, then answers in terminal and native mode and to a worker draining ``lab``'s
    queue (a bad input finished failed with its reason); every call is in the session and the
    tool's log, and the configuration's secret is copied nowhere, though the server gets it."""
    host.configure("calc", "--tools", "add,sub")
    storage, out = host.storage, host.top / "candidates"
    before = snapshot(storage)

    listed = host.ctxmcp("list", "--config", host.config, "--server", "calc")
    assert listed.returncode == 0, listed
    assert {line.split("\t")[0] for line in listed.stdout.splitlines()} == {
        "calc.add",
        "calc.sub",
    }, listed
    projected = host.project(out, "calc", "--json")
    assert projected.returncode == 0, projected
    report = json.loads(projected.stdout)
    assert report["skipped"] == [] and report["server"] == "calc", report
    assert sorted(os.listdir(out)) == ["calc.add.manifest.json", "calc.sub.manifest.json"]
    assert snapshot(storage) == before, "ctxmcp wrote under the storage root (M-1)"
    manifest = json.loads((out / "calc.add.manifest.json").read_text())
    assert manifest["name"] == "calc.add" and "exec" not in manifest  # M-3
    assert manifest["mcp"] == {"transport": "stdio", "config": str(host.config),
                               "server": "calc", "tool": "add"}  # fmt: skip
    assert set(manifest["schema"]["required"]) == {"a", "b"}
    checked = host.ctx("object", "check", *sorted(out.iterdir()))
    assert checked.rc == 0, checked

    made = host.ctx("shared", "create", "lab", "--group", str(nobody_gid()))
    assert made.rc == 0, made
    installed = host.install(out / "calc.add.manifest.json", "shared:lab")
    entry = storage / "shared" / "lab" / "tool" / "calc.add"
    assert installed.out.strip() == f"installed calc.add in tier shared:lab: {entry}"
    controls = entry.parent / "calc.add.d"
    assert json.loads((controls / "mcp").read_text()) == manifest["mcp"]  # M-4
    assert set(os.listdir(storage)) == ROOT_ENTRIES  # no mcp/
    uid = host.agent("coder", ["calc.add"], shared={"lab": ["read", "write"]})

    refused = host.ctx("run", "--agent", "coder", "calc.add", '{"a": 1, "b": 2}')
    assert refused.rc == 126 and "step 6" in refused.err, refused  # installing granted nothing
    allow(controls / "policy", "calc.add")
    ran = host.ctx("run", "--agent", "coder", "calc.add", '{"a": 1, "b": 2}')
    assert (ran.rc, ran.out.strip()) == (0, "3"), ran
    ran, result = host.native("calc.add", {"a": 3, "b": 4})
    assert ran.rc == 0 and result["status"] == "ok", ran
    assert result["output"]["structuredContent"] == {"result": 7}, result

    queue = QueueCLI(storage, "lab")
    good = queue.publish(job("calc.add", {"a": 20, "b": 22}), name="sum")
    bad = queue.publish(job("calc.add", {"a": "twenty"}), name="typo")
    drained, worker = host.drain("lab", "--timeout", "60")
    assert drained.rc == 0, drained
    assert worker[-1]["event"] == "stop" and (worker[-1]["done"], worker[-1]["failed"]) == (1, 1)
    assert queue.state(good) == "done" and queue.state(bad) == "failed"
    assert not queue.entries("claimed") and not queue.entries("lease")
    done = json.loads((queue.dir / "done" / f"{good}.result").read_text())
    assert done["output"]["structuredContent"] == {"result": 42}, done
    failed = json.loads((queue.dir / "failed" / f"{bad}.result").read_text())
    assert failed["status"] == "error" and failed["reason"].startswith("EINVAL"), failed
    assert failed["error"]["stage"] == "schema", failed

    where = "shared/lab/tool/calc.add"
    session = events(storage, uid, "coder", "default")
    direct = results_for(session, where)
    modes = {e["call"]: e["mode"] for e in session if e["type"] == "tool_call"}
    assert [(e["status"], modes[e["call"]]) for e in direct] == [
        ("error", "terminal"),
        ("ok", "terminal"),
        ("ok", "native"),
    ], direct
    by_worker = results_for(events(storage, uid, "coder", "worker"), where)
    assert {e["call"]: e["status"] for e in by_worker} == {
        done["call"]: "ok",
        failed["call"]: "error",
    }
    logged = [e["call"] for e in read_jsonl(controls / "log")]
    assert logged == [e["call"] for e in direct] + [e["call"] for e in by_worker], logged

    # M-4: the secret reached the server (it answers only with it) and is stored nowhere.
    assert SECRET not in projected.stdout + projected.stderr + listed.stdout
    for path, data in every_file(storage, out):
        assert SECRET.encode() not in data, path
        assert b"calc_server.py" not in data and b"CALC_TOKEN" not in data, path
    for policy in storage.rglob("policy"):
        if policy.is_file() and policy != controls / "policy":
            assert "calc." not in policy.read_text() or policy.parent.name == "coder.d", policy


# ============================================================ a user's own tier, non-root


def test_flow_a_non_root_user_adopts_the_time_server_into_their_own_tier(
    unprivileged_user: UnprivilegedUser,
) -> None:
    """R-1, R-4, M-1, M-4, T-8, P-6, T-7: an ordinary user, on a storage root of their own,
    projects the published ``mcp-server-time``, installs the candidate into the user tier
    (``home/<uid>/tool``), grants it to an agent of theirs and calls it; the candidate and
    the tool hold the locator, never the configuration's secret."""
    if not TIME_SERVER.exists():
        pytest.skip("mcp-server-time is not installed in the venv")
    top = new_scratch_dir(SCRATCH, "user-")
    os.chown(top, unprivileged_user.uid, unprivileged_user.gid)
    user = unprivileged_user
    env = clean_env(CTX_STORAGE=str(top / "storage"), HOME=str(top))
    name = "time.get_current_time"

    def as_user(*argv: str | os.PathLike, stdin: str | None = None):
        return run_as(user, [str(a) for a in argv], env=env, cwd=top, stdin=stdin)

    try:
        assert as_user(CTX, "bootstrap").returncode == 0
        mcp = top / "mcp"
        assert as_user("mkdir", "-m", "755", mcp).returncode == 0
        config = {"mcpServers": {"time": {"command": str(TIME_SERVER),
                                          "args": ["--local-timezone", "Etc/UTC"],
                                          "env": {"TIME_API_KEY": SECRET}}}}  # fmt: skip
        wrote = as_user("sh", "-c", f"cat > {mcp}/mcp.json && chmod 644 {mcp}/mcp.json",
                        stdin=json.dumps(config))  # fmt: skip
        assert wrote.returncode == 0, wrote
        out = top / "out"
        projected = as_user(CTXMCP, "project", "--config", mcp / "mcp.json", "--runtime-config",
                            mcp / "mcp.json", "--server", "time", "--out", out)  # fmt: skip
        assert projected.returncode == 0, projected
        assert not (top / "storage" / "home" / str(user.uid) / "tool").exists()  # M-1
        installed = as_user(CTX, "object", "install", out / f"{name}.manifest.json",
                            "--tier", "user")  # fmt: skip
        tier = top / "storage" / "home" / str(user.uid) / "tool"
        assert installed.returncode == 0, installed
        assert installed.stdout.strip() == f"installed {name} in tier user: {tier / name}"
        assert (tier / name).stat().st_uid == user.uid
        assert not (top / "storage" / "tool" / name).exists()
        req = {"name": "me", "label": "me_t", "tools": [name],
               "mount": [[str(mcp), str(mcp), "ro"]]}  # fmt: skip
        made = as_user(CTX, "agent", "create", "-", "--json", stdin=json.dumps(req))
        assert made.returncode == 0, made
        assert json.loads(made.stdout)["identity"]["uid"] == user.uid  # the creating user
        listed = as_user(CTX, "object", "list", "--tier", "user", "--json")
        assert [(t["name"], t["status"]) for t in json.loads(listed.stdout)] == [
            (name, "available")
        ], listed
        refused = as_user(CTX, "run", "--agent", "me", name, '{"timezone": "Etc/UTC"}')
        assert refused.returncode == 126 and "step 6" in refused.stderr, refused
        granted = as_user("sh", "-c", f"echo 'allow me_t tool:{name} execute' >> "
                          f"{tier / (name + '.d')}/policy")  # fmt: skip
        assert granted.returncode == 0, granted
        ran = as_user(CTX, "run", "--agent", "me", "--native", name,
                      stdin='{"timezone": "Asia/Tokyo"}')  # fmt: skip
        assert ran.returncode == 0, ran
        result = [json.loads(line) for line in ran.stdout.splitlines()][-1]
        assert result["output"]["structuredContent"]["timezone"] == "Asia/Tokyo", result

        log = read_jsonl(tier / f"{name}.d" / "log")
        assert [e["status"] for e in log] == ["error", "ok"], log
        session = top / "storage" / "home" / str(user.uid) / "agent" / "me" / "session"
        calls = results_for(read_jsonl(session / "default" / "events.jsonl"), f"home/{user.uid}/"
                            f"tool/{name}")  # fmt: skip
        assert [e["call"] for e in calls] == [e["call"] for e in log], calls
        for path, data in every_file(top / "storage", out):
            assert SECRET.encode() not in data, path
    finally:
        kill_servers(top)
        shutil.rmtree(top, ignore_errors=True)


# ======================================================= the server changes; reinstalled


@needs_fuse
def test_flow_the_servers_tools_change_and_the_projection_is_replaced_atomically(
    host: Host,
) -> None:
    """M-1, M-3, T-8, F-1, W-1, Q-4: with the agent's ``ctx mount --as`` view showing both
    projected tools, the configuration drops ``sub`` (its queued job fails with the server's
    reason, never lost) and adds ``mul`` and a third argument to ``add``; ``project --replace``
    reports what it replaced and leaves the dropped candidate alone; reinstalling ``calc.add``
    swaps in the new controls while readers always find a complete tool, keeps its policy and
    log, and the new version runs as a file of the view; the removed ``calc.sub`` leaves the
    view and fails its next job as not found."""
    host.configure("calc", "--tools", "add,sub")
    storage, out = host.storage, host.top / "candidates"
    assert host.project(out).returncode == 0
    for name in ("calc.add", "calc.sub"):
        host.install(out / f"{name}.manifest.json", "system")
        allow(storage / "tool" / f"{name}.d" / "policy", name)
    host.agent("coder", ["calc.add", "calc.sub"], shared={"proj": ["read", "write"]})
    controls = storage / "tool" / "calc.add.d"

    view = host.top / "view"
    with ctx_mount(storage, view, "--as", "coder"):
        assert {"calc.add", "calc.sub"} <= set(os.listdir(view / "tool"))

        # The administrator reconfigures the server: sub is gone, add takes c, mul is new.
        host.configure("calc", "--tools", "add+,mul")
        queue = QueueCLI(storage, "proj")
        gone = queue.publish(job("calc.sub", {"a": 5, "b": 3}), name="minus")
        drained, _ = host.drain("proj", "--timeout", "60")
        assert drained.rc == 0 and queue.state(gone) == "failed", drained
        reason = json.loads((queue.dir / "failed" / f"{gone}.result").read_text())["reason"]
        assert reason.startswith("EREMOTEIO") and "sub" in reason, reason

        again = host.project(out, "calc", "--replace", "--json")
        assert again.returncode == 0, again
        report = json.loads(again.stdout)
        assert report["replaced"] == [str(out / "calc.add.manifest.json")], report
        assert sorted(report["written"]) == [str(out / f"calc.{t}.manifest.json")
                                             for t in ("add", "mul")], report  # fmt: skip
        assert (out / "calc.sub.manifest.json").exists()  # a dropped tool's candidate stays
        new = json.loads((out / "calc.add.manifest.json").read_text())
        assert "c" in new["schema"]["properties"]

        policy_inode, log_inode = (controls / "policy").stat().st_ino, (controls / "log").stat()
        lines_before = read_jsonl(controls / "log")
        seen: list[str] = []
        stop = threading.Event()

        def reader() -> None:  # what a resolver finds while the reinstall runs
            while not stop.wait(0.002):
                try:
                    if not stat.S_ISREG((storage / "tool" / "calc.add").stat().st_mode):
                        seen.append("executable")
                    for control in ("name", "description", "schema", "cap", "mcp", "policy"):
                        if control in ("schema", "mcp"):
                            json.loads((controls / control).read_text())
                        elif not (controls / control).is_file():
                            seen.append(control)
                except (OSError, ValueError) as exc:
                    seen.append(repr(exc))

        watching = threading.Thread(target=reader)
        watching.start()
        try:
            host.install(out / "calc.add.manifest.json", "system")
        finally:
            stop.set()
            watching.join()
        assert seen == [], seen[:5]
        assert (controls / "policy").stat().st_ino == policy_inode
        assert (controls / "log").stat().st_ino == log_inode.st_ino
        assert read_jsonl(controls / "log")[: len(lines_before)] == lines_before
        assert (controls / "description").read_text().strip() == "Add two or three integers."

        assert wait_for(lambda: "c" in (view / "tool" / "calc.add.d" / "schema").read_text(), 5)
        ran = subprocess.run([view / "tool" / "calc.add", '{"a": 1, "b": 2, "c": 3}'],
                             capture_output=True, text=True, env=clean_env(),
                             timeout=60)  # fmt: skip
        assert (ran.returncode, ran.stdout.strip()) == (0, "6"), ran

        # Removing the dropped tool as docs/tools.md says: executable first, then controls.
        (storage / "tool" / "calc.sub").unlink()
        shutil.rmtree(storage / "tool" / "calc.sub.d")
        assert wait_for(lambda: "calc.sub" not in os.listdir(view / "tool"), 5)
        missing = queue.publish(job("calc.sub", {"a": 1, "b": 1}), name="minus-again")
        drained, _ = host.drain("proj", "--timeout", "60")
        assert drained.rc == 0 and queue.state(missing) == "failed", drained
        reason = json.loads((queue.dir / "failed" / f"{missing}.result").read_text())["reason"]
        assert reason.startswith("ENOENT"), reason
        assert not queue.entries("claimed") and not queue.entries("pending")
    assert set(os.listdir(storage)) == ROOT_ENTRIES


# ============================================================== a server that misbehaves


def test_flow_a_misbehaving_server_fails_its_jobs_with_a_reason_and_leaves_none_claimed(
    host: Host,
) -> None:
    """W-1, W-4, Q-4, Q-5, T-7, S-2, S-4 with §10: jobs naming a projected tool whose server
    crashes mid-call, hangs past the timeout of a worker told to stop meanwhile, prints a
    banner on stdout (its configuration changed) or whose program was removed are each
    finished in ``failed/`` with a reason naming what happened (EIO, ETIMEDOUT, EPROTO,
    ENOENT); nothing stays claimed or leased, ``ctx queue recover`` finds nothing to do, no
    server outlives its call, and each call is in the worker's session and the tool's log,
    where the token a crashing server printed to stderr is redacted."""
    host.configure("calc", "--tools", "act")
    storage, out = host.storage, host.top / "candidates"
    assert host.project(out).returncode == 0
    host.install(out / "calc.act.manifest.json", "system")
    controls = storage / "tool" / "calc.act.d"
    allow(controls / "policy", "calc.act")
    uid = host.agent("coder", ["calc.act"], shared={"proj": ["read", "write"]})
    queue = QueueCLI(storage, "proj")

    crash = queue.publish(job("calc.act", {"how": "crash"}), name="crash")
    drained, _ = host.drain("proj", "--timeout", "60")
    assert drained.rc == 0, drained
    # A worker that waits for work is stopped while the hung call runs: the call still ends
    # at the timeout, and the job is finished before the worker exits (W-4).
    hang = queue.publish(job("calc.act", {"how": "hang"}), name="hang")
    argv = [str(CTX), "queue", "work", "--project", "proj", "--agent", "coder", "--json",
            "--timeout", "4"]  # fmt: skip
    pipe = subprocess.PIPE
    worker = subprocess.Popen(argv, env=host.env, stdin=subprocess.DEVNULL, stdout=pipe,
                              stderr=pipe, text=True)  # fmt: skip
    try:
        assert wait_for(lambda: queue.entries("lease") == {hang}, 30), queue.entries("pending")
        worker.send_signal(signal.SIGTERM)
        said, complaint = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, complaint
    stopped = json.loads(said.splitlines()[-1])
    assert stopped["event"] == "stop" and stopped["stopped_by"] == "SIGTERM", said
    assert (stopped["failed"], stopped["lost"]) == (1, 0), said

    host.configure("calc", "--tools", "act", "--banner")  # a chatty server: stdout garbage
    banner = queue.publish(job("calc.act", {"how": "fine"}), name="banner")
    drained, _ = host.drain("proj", "--timeout", "60")
    assert drained.rc == 0, drained
    host.configure("calc", "--tools", "act")
    (host.mcp / "bin" / "calc-server").unlink()  # the server's program is removed
    removed = queue.publish(job("calc.act", {"how": "fine"}), name="removed")
    drained, _ = host.drain("proj", "--timeout", "60")
    assert drained.rc == 0, drained

    expected = {crash: ("EIO", "exited"), hang: ("ETIMEDOUT", "timed out"),
                banner: ("EPROTO", "calc server starting"),
                removed: ("ENOENT", "calc-server")}  # fmt: skip
    calls = {}
    for name, (code, words) in expected.items():
        assert queue.state(name) == "failed", name
        result = json.loads((queue.dir / "failed" / f"{name}.result").read_text())
        assert result["status"] == "error", result
        assert result["reason"].startswith(code) and words in result["reason"], (name, result)
        calls[result["call"]] = "error"
    assert not queue.entries("claimed") and not queue.entries("lease")
    assert not queue.entries("pending") and not queue.entries("inbox")
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    assert (status.json()["done"], status.json()["failed"]) == (0, 4), status
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    assert wait_for(lambda: not servers_of(host.mcp), 5), servers_of(host.mcp)

    recorded = results_for(events(storage, uid, "coder", "worker"), "tool/calc.act")
    assert {e["call"]: e["status"] for e in recorded} == calls, recorded
    assert sorted(e["call"] for e in read_jsonl(controls / "log")) == sorted(calls)
    # S-4: the crashed server's stderr named its token; the records keep the fact, not it.
    worker_events = storage / "home" / str(uid) / "agent" / "coder" / "session" / "worker"
    for path, data in every_file(worker_events, controls):
        assert SECRET.encode() not in data, path
    crashed = json.loads((queue.dir / "failed" / f"{crash}.result").read_text())
    assert "exited (status 9)" in crashed["reason"], crashed
    for record in (recorded, read_jsonl(controls / "log")):
        [fact] = [e for e in record if e["call"] == crashed["call"]]
        assert "its stderr ends: fatal: CALC_TOKEN=[redacted] was refused" in fact["message"]
