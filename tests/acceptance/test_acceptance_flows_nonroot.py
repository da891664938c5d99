"""End-to-end flows of one ordinary, unprivileged user working CortexFS on their own machine
(README quickstart "as another user", SPEC §1 R-1/R-2/R-4/R-5): with no ``CTX_STORAGE`` and no
option, ``ctx`` works the root in ``$XDG_DATA_HOME/cortexfs/storage/current``; the user
installs tools of their own into its tiers, makes agents that run as themselves, runs tools in
both modes, keeps a space with a queue and a worker, reads sessions and the manual, mounts the
root with FUSE, and is told — with the errno and what to do — whatever needs root.  Every
command runs as the real test user, from a login-like environment of its own; every file the
journey leaves is that user's."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to switch to the unprivileged test user"
)

SCRATCH = scratch_top(__file__)
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
CORE_TOOLS = {"fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config"}
RUNTIME = Path("/run/cortexfs/terminal")
# A tool that says which tier it came from, in which mode it ran, as which uid, and what it got.
PROGRAM = """#!/bin/sh
if [ "$CTX_MODE" = native ]; then got=$(cat); else got="$*"; fi
printf '%s %s %s %s\\n' {tier} "$CTX_MODE" "$(id -u)" "$got"
"""


# ------------------------------------------------------------------------------ the user


@dataclass
class Desk:
    """The test user at a machine of their own: a home below a scratch directory, the XDG
    directories in it, and ``ctx`` run as that user from a clean login-like environment."""

    user: UnprivilegedUser
    top: Path
    home: Path

    @property
    def uid(self) -> int:
        return self.user.uid

    @property
    def data_home(self) -> Path:
        return self.home / "xdg-data"

    @property
    def root(self) -> Path:
        """Where R-1 puts a non-root user's root: ``$XDG_DATA_HOME/cortexfs/storage/current``."""
        return self.data_home / "cortexfs" / "storage" / "current"

    @property
    def env(self) -> dict[str, str]:
        home = self.home
        return {
            "PATH": PATH,
            "HOME": str(home),
            "USER": self.user.name,
            "LOGNAME": self.user.name,
            "LANG": "C.UTF-8",
            "XDG_DATA_HOME": str(self.data_home),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_RUNTIME_DIR": str(self.top / "run"),
        }

    def run(
        self, argv: list[str], *, stdin: str = "", cwd: Path | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            input=stdin,
            user=self.user.uid,
            group=self.user.gid,
            extra_groups=[],
            umask=0o022,
            env=self.env,
            cwd=cwd or self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ctx(self, *args: str | os.PathLike, stdin: str = "", cwd: Path | None = None):
        return self.run([*CTX_ARGV, *map(str, args)], stdin=stdin, cwd=cwd)

    def sh(self, script: str, *args: str | os.PathLike) -> subprocess.CompletedProcess[str]:
        return self.run(["/bin/sh", "-c", script, "sh", *map(str, args)])

    def write(self, path: Path, text: str, mode: int = 0o644) -> Path:
        """``path`` written by the user (directories made as needed)."""
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        done = self.run(["/bin/sh", "-c", script, "sh", str(path), f"{mode:o}"], stdin=text)
        assert done.returncode == 0, done.stderr
        return path

    def allow(self, label: str, tool: str, tier: Path | None = None) -> None:
        """The tool's own half of P-6, written by the user (the tool's policy is theirs)."""
        policy = (tier or self.root / "tool") / f"{tool}.d" / "policy"
        done = self.sh('printf "%s\\n" "$2" >> "$1"', policy, f"allow {label} tool:{tool} execute")
        assert done.returncode == 0, done.stderr

    def manifest(self, name: str, tier_word: str) -> Path:
        """A v2 manifest (T-8) of tool ``name`` that prints ``tier_word`` first, the user's."""
        directory = self.home / "src" / tier_word
        self.write(directory / f"{name}.sh", PROGRAM.replace("{tier}", tier_word))
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"Say where {name} came from.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": f"{name}.sh",
        }
        return self.write(directory / f"{name}.json", json.dumps(document))

    def bootstrap(self) -> None:
        done = self.ctx("bootstrap")
        assert done.returncode == 0, done

    def agent(self, name: str, tools: list[str], **extra) -> dict:
        request = {"name": name, "label": f"{name}_t", "tools": tools, **extra}
        made = self.ctx("agent", "create", "--json", "-", stdin=json.dumps(request))
        assert made.returncode == 0, made
        return json.loads(made.stdout)

    def strangers(self) -> list[str]:
        """Every entry below the home (links included, never followed) that is not the
        user's, with its owner."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.home):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                info = path.lstat()
                if (info.st_uid, info.st_gid) != (self.user.uid, self.user.gid):
                    found.append(f"{path} ({info.st_uid}:{info.st_gid})")
        return found


@pytest.fixture
def desk() -> Iterator[Desk]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "u")
    home = top / "home"
    run = top / "run"
    for directory, mode in ((home, 0o755), (run, 0o700)):
        directory.mkdir(mode=mode)
        os.chown(directory, user.uid, user.gid)
    try:
        yield Desk(user, top, home)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def frames(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def root_key(root: Path) -> str:
    """docs/tools.md: the first 16 hex digits of the SHA-256 of the root's real path."""
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ the flows


def test_bootstrap_makes_the_users_own_root_in_xdg_data_home_and_nothing_else(
    desk: Desk,
) -> None:
    """R-1, R-2, R-5, D-1: with no configuration the user's ``ctx bootstrap`` makes
    ``$XDG_DATA_HOME/cortexfs/storage/current`` (the private data home, 0755 root and six
    entries, core tools, tsh config, manual bundle), all of it the user's and nothing outside
    it; ``ctx man`` reads the installed page and a second bootstrap changes nothing."""
    boot = desk.ctx("bootstrap")
    assert boot.returncode == 0, boot
    assert boot.stdout.splitlines()[0] == f"storage root: {desk.root}", boot.stdout

    assert set(os.listdir(desk.root)) == ROOT_ENTRIES
    assert {mode(desk.root / e) for e in ROOT_ENTRIES} | {mode(desk.root)} == {0o755}
    assert mode(desk.data_home) == 0o700  # XDG: a data home made for the user is private
    assert os.listdir(desk.home) == ["xdg-data"], "bootstrap wrote outside the data home"
    assert os.listdir(desk.data_home) == ["cortexfs"]
    assert desk.strangers() == []

    tools = desk.root / "tool"
    for name in CORE_TOOLS:
        assert os.access(tools / name, os.X_OK) and (tools / f"{name}.d" / "policy").is_file()
    config = (tools / "tsh.d" / "config").read_text()
    for setting in ("max_loaded_tools=64", "cache_capacity=32", "window_percent=1"):
        assert setting in config.splitlines(), config
    assert (desk.root / "bin" / "tsh").is_file() and (desk.root / "bin" / "ctxterm").is_file()
    listed = desk.ctx("object", "list", "--json")
    assert listed.returncode == 0, listed
    core = {o["name"]: o for o in json.loads(listed.stdout) if o["name"] in CORE_TOOLS}
    assert set(core) == CORE_TOOLS
    assert {(o["tier"], o["status"]) for o in core.values()} == {("system", "available")}
    assert all(Path(o["path"]).parent == tools for o in core.values())

    page = desk.root / "shared" / "cortexfs-docs" / "man" / "ctx.agent.md"
    manual = desk.ctx("man", "agent")
    assert manual.returncode == 0, manual
    assert manual.stdout == page.read_text()

    before = snapshot(desk.root)
    again = desk.ctx("bootstrap")
    assert again.returncode == 0, again
    assert snapshot(desk.root) == before
    assert desk.strangers() == []


def test_own_tools_in_the_user_and_system_tiers_run_as_the_users_own_agent_in_both_modes(
    desk: Desk,
) -> None:
    """T-8, T-8a, T-4, R-4, A-3, P-6, T-3, T-7, S-1, S-2: the user installs one tool into the
    system tier and another into their user tier; an agent they create runs as their uid; a
    call is refused until the tool's own policy allows it, then runs in terminal and native
    mode as that uid, recorded in the home session and the tools' logs, all the user's."""
    desk.bootstrap()
    system_tool = desk.ctx("object", "install", desk.manifest("shout", "system"),
                           "--tier", "system")  # fmt: skip
    assert system_tool.returncode == 0, system_tool
    assert system_tool.stdout.strip().endswith(f"tier system: {desk.root}/tool/shout")
    user_tier = desk.root / "home" / str(desk.uid) / "tool"
    user_tool = desk.ctx("object", "install", desk.manifest("mine", "user"), "--tier", "user")
    assert user_tool.returncode == 0, user_tool
    assert user_tool.stdout.strip().endswith(f"tier user: {user_tier}/mine"), user_tool
    listed = desk.ctx("object", "list", "--tier", "user", "--json")
    assert [(o["name"], o["status"]) for o in json.loads(listed.stdout)] == [("mine", "available")]
    which = desk.ctx("object", "which", "shout")
    assert (which.returncode, which.stdout) == (0, f"{desk.root}/tool/shout\n"), which

    made = desk.agent("coder", ["shout", "mine"])
    assert made["identity"] == {"uid": desk.uid, "gid": desk.user.gid, "groups": []}, made
    assert made["default_user"] is None

    refused = desk.ctx("run", "--agent", "coder", "shout")  # installing grants nothing
    assert refused.returncode == 126, refused
    assert refused.stderr.startswith("ctx: EACCES: step 6 (tool/model policy): "), refused
    desk.allow("coder_t", "shout")
    desk.allow("coder_t", "mine", user_tier)

    terminal = desk.ctx("run", "--agent", "coder", "shout", "a", "b")
    assert (terminal.returncode, terminal.stdout) == (0, f"system terminal {desk.uid} a b\n")
    native = desk.ctx("run", "--agent", "coder", "--native", "mine", stdin='{"n": 1}')
    assert native.returncode == 0, native
    call, result = frames(native.stdout)
    assert (call["type"], result["type"], result["status"]) == ("call", "result", "ok")
    assert result["output"] == f'user native {desk.uid} {{"n": 1}}\n', result
    session = f"home/{desk.uid}/agent/coder/session/default"
    assert result["session"] == session and result["exit_status"] == 0

    log = desk.root / session / "events.jsonl"
    assert (log.stat().st_uid, mode(log)) == (desk.uid, 0o600)
    kinds = [(e["type"], e["object"], e["status"]) for e in events(log)]
    assert kinds == [
        ("tool_call", "tool/shout", "ok"),
        ("tool_result", "tool/shout", "error"),
        ("tool_call", "tool/shout", "ok"),
        ("tool_result", "tool/shout", "ok"),
        ("tool_call", f"home/{desk.uid}/tool/mine", "ok"),  # the object where it lives
        ("tool_result", f"home/{desk.uid}/tool/mine", "ok"),
    ]
    for tool_log in (desk.root / "tool" / "shout.d" / "log", user_tier / "mine.d" / "log"):
        assert tool_log.stat().st_uid == desk.uid and tool_log.read_text().strip(), tool_log

    tail = desk.ctx("session", "tail", "coder", "-n", "2", "--json")
    assert tail.returncode == 0, tail
    assert [e["type"] for e in frames(tail.stdout)] == ["tool_call", "tool_result"]
    assert frames(tail.stdout) == events(log)[-2:]
    shown = desk.ctx("session", "show", "coder")
    assert shown.returncode == 0 and shown.stdout.count("tool/mine") == 2, shown
    assert desk.strangers() == []


def test_what_needs_root_is_refused_with_the_errno_and_what_to_do(desk: Desk) -> None:
    """P-5 step 1, A-1, F-1, README ("each says so, and what to do"): as an ordinary user,
    an agent of another uid cannot be created, one whose identity was edited to another uid
    runs nothing (EACCES at step 1, in both modes), a terminal cannot be started (EPERM naming
    root's command), and a mount without access to /dev/fuse is EACCES naming the remedy."""
    desk.bootstrap()
    desk.ctx("object", "install", desk.manifest("shout", "system"), "--tier", "system")
    agents = set(os.listdir(desk.root / "agent"))

    other = json.dumps({"name": "other", "label": "other_t", "tools": ["shout"]})
    for option in (["--user", "nobody"], ["--groups", "0"]):
        made = desk.ctx("agent", "create", *option, "-", stdin=other)
        assert made.returncode == 1, made
        assert made.stderr.startswith("ctx: EPERM: only root can create an agent"), made
        assert "have root create the agent" in made.stderr, made
    as_root = desk.ctx("agent", "create", "--user", "root", "-", stdin=other)
    assert as_root.returncode == 2 and "ctx: EINVAL: an agent never runs as root" in as_root.stderr
    assert set(os.listdir(desk.root / "agent")) == agents

    desk.agent("ghost", ["shout"])
    desk.allow("ghost_t", "shout")
    identity = desk.root / "agent" / "ghost.d" / "identity"
    desk.write(identity, json.dumps({"uid": 65534, "gid": 65534, "groups": []}))
    step1 = f"step 1 (peer credentials): the caller is uid {desk.uid} gid {desk.user.gid}"
    terminal = desk.ctx("run", "--agent", "ghost", "shout")
    assert terminal.returncode == 126 and terminal.stdout == "", terminal
    assert terminal.stderr.startswith(f"ctx: EACCES: {step1}"), terminal
    native = desk.ctx("run", "--agent", "ghost", "--native", "shout", stdin="{}")
    assert native.returncode == 1, native
    result = frames(native.stdout)[-1]
    assert (result["status"], result["output"], result["exit_status"]) == ("error", None, None)
    assert result["error"]["error"] == "EACCES" and result["error"]["stage"] == "authorize"
    assert result["error"]["step"] == 1 and result["error"]["message"].startswith(step1)
    assert desk.ctx("queue", "init", "--project", "p").returncode == 0
    job = desk.ctx("queue", "publish", "--project", "p", "-",
                   stdin='{"tool": "shout", "input": {}}')  # fmt: skip
    assert job.returncode == 0, job
    worker = desk.ctx("queue", "work", "--project", "p", "--agent", "ghost", "--drain")
    assert worker.returncode == 0, worker  # W-1: a denial fails the job, not the worker
    failed = desk.root / "shared" / "p" / "queue" / "failed" / f"{job.stdout.strip()}.result"
    error = json.loads(failed.read_text())["error"]
    assert (error["error"], error["stage"], error["step"]) == ("EACCES", "authorize", 1), error

    desk.agent("coder", ["shout"])
    workspace = desk.home / "ws"
    desk.sh('mkdir -p "$1"', workspace)
    session = f"s{uuid.uuid4().hex[:8]}"
    start = desk.ctx("agent", "start", "coder", "--session", session, cwd=workspace)
    assert start.returncode == 1 and start.stdout == "", start
    assert start.stderr.startswith("ctx: EPERM: an agent terminal is started by root"), start
    assert f"have root run 'ctx --storage {desk.root} agent start coder" in start.stderr
    assert "'ctx run --agent coder TOOL'" in start.stderr, start
    assert not (RUNTIME / root_key(desk.root)).exists()
    log = events(desk.root / "agent" / "coder.d" / "log")
    assert [e["type"] for e in log] == ["agent.created"]
    for verb in ("stop", "watch"):
        none = desk.ctx("agent", verb, "coder", "--session", session)
        assert none.returncode == 1, none
        assert none.stderr.startswith(f"ctx: ENOENT: no terminal of coder in session {session}")

    missing = desk.ctx("mount", "--as", "coder", desk.home / "nowhere")
    assert missing.returncode == 1, missing
    assert missing.stderr.startswith("ctx: ENOENT: "), missing
    assert "'mkdir -p ~/ctx && ctx mount --as coder ~/ctx'" in missing.stderr, missing
    fuse = Path("/dev/fuse")
    if (
        fuse.exists()
        and desk.run(["/bin/sh", "-c", "test -r /dev/fuse -a -w /dev/fuse"]).returncode
    ):
        mountpoint = desk.home / "ctx"
        desk.sh('mkdir "$1"', mountpoint)
        denied = desk.ctx("mount", mountpoint)
        assert denied.returncode == 1, denied
        assert denied.stderr.startswith("ctx: EACCES: cannot mount "), denied
        assert "/dev/fuse" in denied.stderr, denied
        assert f"run 'ctx mount {mountpoint}" in denied.stderr, denied
        assert os.listdir(mountpoint) == [] and not os.path.ismount(mountpoint)
    assert desk.strangers() == []


def test_a_space_of_ones_own_with_a_queue_a_drain_worker_and_recover(desk: Desk) -> None:
    """X-1, §2.4, Q-1..Q-5, W-1, W-2, S-1, S-6: the user makes a space (their group, the
    documented modes), publishes jobs, claims one from a shell that exits and recovers it, then
    a ``ctx queue work --drain`` worker running as their agent finishes every job — a tool the
    agent may not run ends failed with the step that denied it — and a call recorded in the
    space lands there 0660; the session shows the worker's transitions; all is the user's."""
    desk.bootstrap()
    desk.ctx("object", "install", desk.manifest("shout", "system"), "--tier", "system")
    created = desk.ctx("shared", "create", "proj", "--json")
    assert created.returncode == 0, created
    assert json.loads(created.stdout)["gid"] == desk.user.gid
    space = desk.root / "shared" / "proj"
    queue = space / "queue"
    assert set(os.listdir(queue)) == QUEUE_SUBDIRS | {"config"}
    modes = {p: mode(space / p) for p in ("", "agent", "queue", "tool", "data")}
    assert modes == {"": 0o3770, "agent": 0o3770, "queue": 0o3770, "tool": 0o2750,
                     "data": 0o2770}  # fmt: skip
    assert {mode(queue / sub) for sub in QUEUE_SUBDIRS} == {0o2770}
    init = desk.ctx("queue", "init", "--project", "proj")
    assert (init.returncode, init.stdout) == (0, f"queue {queue} ready\n"), init

    desk.agent("runner", ["shout"], shared={"proj": ["read", "write"]})
    desk.allow("runner_t", "shout")
    names = []
    for n in range(3):
        request = json.dumps({"tool": "shout", "input": {"n": n}})
        published = desk.ctx("queue", "publish", "--project", "proj", "--name", f"job{n}", "-",
                             stdin=request)  # fmt: skip
        assert published.returncode == 0, published
        names.append(published.stdout.strip())
    assert names == ["job0.req.json", "job1.req.json", "job2.req.json"]
    forbidden = json.dumps({"tool": "fs.read", "input": {"path": "x"}})
    desk.ctx("queue", "publish", "--project", "proj", "--name", "denied", "-", stdin=forbidden)

    left = desk.run(["/bin/sh", "-c", '"$@"; true', "sh", *CTX_ARGV, "queue", "claim",
                     "--project", "proj"])  # fmt: skip
    assert left.stdout == "job0.req.json\n", left
    assert (queue / "claimed" / "job0.req.json" / "job0.req.json").is_file()
    recovered = desk.ctx("queue", "recover", "--project", "proj", "--json")
    assert recovered.returncode == 0, recovered
    report = json.loads(recovered.stdout)
    assert report["consistent"] is True, report
    assert [(r["job"], r["action"], r["applied"]) for r in report["requeued"]] == [
        ("job0.req.json", "requeue", True)
    ]
    assert sorted(os.listdir(queue / "pending")) == sorted([*names, "denied.req.json"])

    worker = desk.ctx("queue", "work", "--project", "proj", "--agent", "runner", "--drain")
    assert worker.returncode == 0, worker
    assert sorted(os.listdir(queue / "done")) == sorted([*names, *(f"{j}.result" for j in names)])
    assert sorted(os.listdir(queue / "failed")) == ["denied.req.json", "denied.req.json.result"]
    for n, job in enumerate(names):
        outcome = json.loads((queue / "done" / f"{job}.result").read_text())
        assert outcome["status"] == "ok"
        assert outcome["output"] == f'system native {desk.uid} {{"n": {n}}}\n', outcome
    failure = json.loads((queue / "failed" / "denied.req.json.result").read_text())
    assert failure["status"] == "error" and failure["error"]["error"] == "EACCES"
    assert failure["error"]["stage"] == "authorize" and failure["error"]["step"] == 5, failure
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert os.listdir(queue / sub) == [], sub
    status = desk.ctx("queue", "status", "--project", "proj", "--json")
    counts = json.loads(status.stdout)["counts"]
    assert (counts["done"], counts["failed"], counts["pending"], counts["claimed"]) == (3, 1, 0, 0)

    listed = desk.ctx("session", "list", "runner")
    assert listed.stdout.split() == ["worker"], listed
    shown = desk.ctx("session", "show", "runner", "worker", "--json")
    assert shown.returncode == 0, shown
    trail = frames(shown.stdout)
    finished = [e["object"] for e in trail if e["type"] == "queue.finish"]
    assert sorted(finished) == sorted(f"queue/{j}" for j in [*names, "denied.req.json"])
    assert sum(e["type"] == "tool_result" and e["status"] == "ok" for e in trail) == 3

    cache = desk.home / ".cache" / "cortexfs" / "claim-order"  # docs/queue.md: the user's hint
    hints = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert hints and {mode(p) for p in hints} == {0o600}, hints
    assert {mode(d) for d in (desk.home / ".cache", cache.parent, cache)} == {0o700}

    in_space = desk.ctx("run", "--agent", "runner", "--project", "proj", "--session", "s",
                        "shout", "here")  # fmt: skip
    assert (in_space.returncode, in_space.stdout) == (0, f"system terminal {desk.uid} here\n")
    shared_log = space / "agent" / "runner" / "session" / "s" / "events.jsonl"
    info = shared_log.stat()
    assert (info.st_uid, info.st_gid, mode(shared_log)) == (desk.uid, desk.user.gid, 0o660)
    assert [e["type"] for e in events(shared_log)] == ["tool_call", "tool_result"]
    assert desk.strangers() == []


# ------------------------------------------------------------------------------ FUSE


NAMESPACE_SCRIPT = """
set -e
dev=$1; shift
if [ -n "$dev" ]; then
    mount -t tmpfs -o size=16k,mode=0755 cortexfs-test-dev "$dev"
    mknod -m 0666 "$dev/fuse" c 10 229
    mount --bind "$dev/fuse" /dev/fuse
fi
exec "$@"
"""

USER_MOUNT_SCRIPT = """
ctx=$1; out=$2; as=$3
cd "$HOME"
for view in host "$as"; do
    mkdir -p "$view"
    if [ "$view" = host ]; then "$ctx" mount "$view" > "$out/$view.out" 2> "$out/$view.err" &
    else "$ctx" mount --as "$view" "$view" > "$out/$view.out" 2> "$out/$view.err" &
    fi
    pid=$!
    for i in $(seq 200); do grep -q " $HOME/$view " /proc/self/mountinfo && break; sleep 0.05; done
    grep " $HOME/$view " /proc/self/mountinfo > "$out/$view.mountinfo"
    ls "$view" > "$out/$view.root"
    ls "$view/tool" > "$out/$view.tools"
    cat "$view/tool/shout.d/description" > "$out/$view.description" 2>&1
    stat -c '%u' "$view/tool/shout" > "$out/$view.owner" 2>&1
    "$ctx" umount "$view"; echo $? > "$out/$view.umount"
    wait $pid; echo $? > "$out/$view.status"
done
"""


def _user_can_open_fuse(desk: Desk) -> bool:
    return desk.run(["/bin/sh", "-c", "test -r /dev/fuse -a -w /dev/fuse"]).returncode == 0


def test_the_user_mounts_their_root_and_their_agents_view_with_fusermount3(desk: Desk) -> None:
    """F-1, T-5, R-2, README ("ctx mount needs root, or a /dev/fuse the user may open (mode 0666
    on most distributions) with a setuid fusermount3"): as the user, ``ctx mount`` shows their
    root with its six entries and their files, ``--as coder`` shows only what coder may run,
    neither serves other uids (no ``allow_other``), and ``ctx umount`` ends each cleanly.  On a
    host whose /dev/fuse is 0600 the distributions' 0666 is given in a private mount namespace."""
    fusermount = shutil.which("fusermount3")
    if fusermount is None or not os.stat(fusermount).st_mode & stat.S_ISUID:
        pytest.skip("needs a setuid-root fusermount3")
    if not os.path.exists("/dev/fuse") or shutil.which("unshare") is None:
        pytest.skip("needs /dev/fuse and util-linux unshare")
    desk.bootstrap()
    desk.ctx("object", "install", desk.manifest("shout", "system"), "--tier", "system")
    desk.agent("coder", ["shout"])
    desk.allow("coder_t", "shout")
    out = desk.top / "out"
    out.mkdir(mode=0o700)
    os.chown(out, desk.uid, desk.user.gid)
    dev = "" if _user_can_open_fuse(desk) else str(desk.top / "dev")
    if dev:
        Path(dev).mkdir(mode=0o755)
    env = [f"{k}={v}" for k, v in desk.env.items()]
    as_user = ["setpriv", f"--reuid={desk.uid}", f"--regid={desk.user.gid}", "--clear-groups",
               "env", "-i", *env, "/bin/sh", "-c", USER_MOUNT_SCRIPT, "sh",
               CTX_ARGV[0], str(out), "coder"]  # fmt: skip
    argv = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", NAMESPACE_SCRIPT, "sh",
            dev, *as_user]  # fmt: skip
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=45)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if dev and proc.returncode != 0 and "mknod" in err:
        pytest.skip(f"cannot give /dev/fuse the distributions' mode here: {err.strip()}")
    assert proc.returncode == 0, err

    def read(name: str) -> str:
        return (out / name).read_text()

    for view in ("host", "coder"):
        assert read(f"{view}.status") == "0\n", (view, read(f"{view}.err"))
        assert read(f"{view}.umount") == "0\n", view
        fields = read(f"{view}.mountinfo").split()
        assert fields[fields.index("-") + 1] == "fuse.cortexfs", fields
        options = fields[-1].split(",")
        assert f"user_id={desk.uid}" in options and "allow_other" not in options, options
        assert read(f"{view}.root").split() == sorted(ROOT_ENTRIES), view
        assert read(f"{view}.description") == "Say where shout came from.\n", view
        assert read(f"{view}.owner") == f"{desk.uid}\n", view
    host_tools = set(read("host.tools").split())
    assert CORE_TOOLS | {"shout"} <= host_tools
    coder_tools = set(read("coder.tools").split())
    assert "shout" in coder_tools and not (CORE_TOOLS & coder_tools), coder_tools
    assert not any(os.path.ismount(desk.home / v) for v in ("host", "coder"))
    assert desk.strangers() == []


# ------------------------------------------------------------------------------ terminal


ATTACH = """
import os, socket, sys, time
os.chdir(sys.argv[1])  # the A-2 link, short enough to reach from its own directory
sock = socket.socket(socket.AF_UNIX)
sock.connect("main.sock")
sock.sendall(b"attach\\n")
sock.settimeout(20)
data = b""
deadline = time.monotonic() + 20
sent = False
while time.monotonic() < deadline:
    chunk = sock.recv(65536)
    if not chunk:
        break
    data += chunk
    if not sent and data.endswith(b"$ "):
        sock.sendall(b"shout hello\\r")
        sent = True
    elif sent and b"terminal" in data.split(b"shout hello", 1)[-1] and data.endswith(b"$ "):
        break
sys.stdout.write(data.decode("utf-8", "replace"))
"""


@pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)
def test_root_starts_the_users_agent_terminal_the_user_works_in_it_and_root_stops_it(
    desk: Desk,
) -> None:
    """A-1, A-2, H-1, T-3, S-1: following the remedy ``ctx agent start`` gives the user, root
    starts their agent's terminal on their root; the user, the root's owner, watches it and
    types a tool call into it, which runs as their uid and is recorded in their session; the
    user's ``stop`` is EPERM (root started it), root's stops it and its runtime is gone."""
    desk.bootstrap()
    desk.ctx("object", "install", desk.manifest("shout", "system"), "--tier", "system")
    desk.agent("coder", ["shout"])
    desk.allow("coder_t", "shout")
    workspace = desk.home / "ws"
    desk.sh('mkdir -p "$1"', workspace)
    session = f"s{uuid.uuid4().hex[:8]}"
    root_env = {"PATH": PATH, "LANG": "C.UTF-8"}
    root_ctx = [*CTX_ARGV, "--storage", str(desk.root), "agent"]

    def as_root(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*root_ctx, *args, "coder", "--session", session]
        return subprocess.run(argv, env=root_env, cwd=workspace, capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    started = as_root("start", "--json")
    assert started.returncode == 0, started
    try:
        facts = json.loads(started.stdout)
        runtime = RUNTIME / root_key(desk.root) / str(desk.uid) / "coder" / session
        assert facts["workspace"] == str(workspace)
        assert Path(facts["listening_at"]) == runtime / "main.sock", facts
        link = desk.root / "home" / str(desk.uid) / "agent" / "coder" / "session" / session
        link = link / "terminal" / "main.sock"
        assert os.path.samefile(link, runtime / "main.sock")

        watched = desk.run(["timeout", "-s", "INT", "3", *CTX_ARGV, "agent", "watch", "coder",
                            "--session", session])  # fmt: skip
        assert "coder$ " in watched.stdout, watched

        typed = desk.run([str(Path(CTX_ARGV[0]).with_name("python")), "-c", ATTACH,
                          str(link.parent)])  # fmt: skip
        assert f"system terminal {desk.uid} hello" in typed.stdout, typed

        mine = desk.ctx("agent", "stop", "coder", "--session", session)
        assert mine.returncode == 1, mine
        assert mine.stderr.startswith("ctx: EPERM: ") and "stop it as root" in mine.stderr, mine
    finally:
        stopped = as_root("stop")
    assert stopped.returncode == 0, stopped
    assert stopped.stdout.startswith(f"stopped coder, session {session} (pid "), stopped
    assert wait_for(lambda: not runtime.exists(), 10), "the terminal's runtime was left"
    assert not link.exists() and not link.is_symlink()

    recorded = events(link.parent.parent / "events.jsonl")
    calls = [(e["type"], e["status"], e.get("mode")) for e in recorded]
    assert calls == [("tool_call", "ok", "terminal"), ("tool_result", "ok", None)], recorded
    lifecycle = [e for e in events(desk.root / "agent" / "coder.d" / "log")
                 if e.get("session") == session]  # fmt: skip
    assert [(e["type"], e.get("reason")) for e in lifecycle] == [
        ("terminal.started", None),
        ("terminal.stopped", "stop"),
    ]
    # The session's own files stay the user's, and the A-2 place root made for the socket
    # link goes with the link: nothing of root's is left in the user's root.
    assert desk.strangers() == [], desk.strangers()
    assert not link.parent.exists()
