"""One setup reached through different orders of its steps (SPEC R-2, R-5, §2.4, W-1, W-2,
S-1, P-5, P-6, T-4, T-5, T-8, A-1, A-3, X-1, F-1; README "Tools, agents and MCP servers" and
"Upgrading"; docs/tools.md "Agents, host side", "CTX_PATH", "Listing and resolving",
"ctx bootstrap"; docs/sessions.md "Shared spaces"; docs/queue.md "Command line";
docs/workers.md; docs/mount.md; ``ctx ... --help``).

An administrator sets up ``ctx bootstrap``, ``ctx shared create``, ``ctx object install`` into
the system and a space's tier, ``ctx agent create``, policy edits, ``ctx agent start``, a
worker on a queue and ``ctx mount`` in whatever order comes to mind: an agent made before the
space or the tool it names, a tool installed after the policy that grants it, a worker
started before its space or its agent, a mount started before any agent, a terminal started
before the tools it will call, ``ctx bootstrap`` run again in the middle of a running setup.
Whatever the order, the end state (files, modes, groups, controls) and the behaviour (calls,
jobs, views) must be the same; an order that cannot work must be refused up front with an
errno-style error that says what to do, leaving nothing half-made; an order the docs require
(bootstrap before workers after an upgrade) must be enforced."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    serving,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import Raw
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="agents of another uid, terminals and FUSE views need root, bwrap and /dev/fuse",
)

SCRATCH = scratch_top(__file__)
NOBODY = pwd.getpwnam("nobody")
CORE_ENTRIES = {"bin", "tool", "agent", "model", "home", "shared"}
GREET = "#!/bin/sh\nprintf 'greet %s\\n' \"${1:-native}\"\n"
HELLO = "#!/bin/sh\nprintf 'hello from the space\\n'\n"
NAP = "#!/bin/sh\nsleep 1\nprintf 'napped\\n'\n"


# ----------------------------------------------------------------------------- the world


@dataclass
class Host(OnStorage):
    """A storage root in a scratch directory every uid may search, and what a test made."""

    top: Path
    storage: Path
    workers: list[subprocess.Popen] = field(default_factory=list)
    terminals: list[tuple[str, str]] = field(default_factory=list)  # (agent, session)

    # -- setup steps

    def agent(self, name: str = "coder", **fields) -> Run:
        req = {"name": name, "label": f"{name}_t", **fields}
        return self.ctx("agent", "create", "-", "--json", input=json.dumps(req))

    def manifest(self, name: str, program: str) -> Path:
        return tool_manifest(self.top / "manifests", name, program)

    def install(self, name: str, program: str, tier: str = "system") -> Run:
        return self.ctx("object", "install", self.manifest(name, program), "--tier", tier)

    def tool_dir(self, tool: str, space: str | None = None) -> Path:
        tier = self.storage / "shared" / space / "tool" if space else self.storage / "tool"
        return tier / f"{tool}.d"

    def grant(self, tool: str, label: str = "coder_t", space: str | None = None) -> None:
        """The tool's half of P-6, written by hand as the docs say."""
        with (self.tool_dir(tool, space) / "policy").open("a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")

    def space(self, name: str, *options: str) -> Run:
        return self.ctx("shared", "create", name, *options)

    # -- running things

    def run(self, tool: str, *args: str, agent: str = "coder", **kw) -> Run:
        return self.ctx("run", "--agent", agent, *kw.pop("options", ()), tool, *args, **kw)

    def native(self, tool: str, agent: str = "coder", payload: dict | None = None) -> dict:
        r = self.ctx("run", "--agent", agent, "--native", tool, input=json.dumps(payload or {}))
        return json.loads(r.lines()[-1])

    def worker(self, project: str, agent: str = "coder", *args: str) -> subprocess.Popen:
        log = self.top / f"worker-{uuid.uuid4().hex[:8]}"
        argv = [*CTX_ARGV, "queue", "work", "--project", project, "--agent", agent, "--json"]
        with open(f"{log}.out", "wb") as out, open(f"{log}.err", "wb") as err:
            proc = subprocess.Popen(
                [*argv, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=self.env
            )
        proc.log = log  # type: ignore[attr-defined]
        self.workers.append(proc)
        return proc

    def start(self, session: str, agent: str = "coder", cwd: Path | None = None) -> Run:
        started = self.ctx("agent", "start", agent, "--session", session, "--json", cwd=cwd)
        if started.rc == 0:
            self.terminals.append((agent, session))
        return started

    def show(self, agent: str = "coder") -> dict:
        shown = self.ctx("agent", "show", agent, "--json")
        assert shown.rc == 0, shown
        return shown.json()

    def home_session(self, agent: str, session: str, uid: int = NOBODY.pw_uid) -> Path:
        return self.storage / "home" / str(uid) / "agent" / agent / "session" / session

    def teardown(self) -> None:
        for agent, session in self.terminals:
            self.ctx("agent", "stop", agent, "--session", session)
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def worker_events(proc: subprocess.Popen) -> list[dict]:
    """The JSON lines the worker has printed so far (a line still being written left out)."""
    text = Path(f"{proc.log}.out").read_text()  # type: ignore[attr-defined]
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def worker_stderr(proc: subprocess.Popen) -> str:
    return Path(f"{proc.log}.err").read_text()  # type: ignore[attr-defined]


def finished(proc: subprocess.Popen, job: str) -> dict | None:
    """The ``finish`` event of ``job`` the worker printed, if any yet."""
    for event in worker_events(proc):
        if event.get("event") == "finish" and event.get("job") == job:
            return event
    return None


def result(queue: QueueCLI, job: str) -> tuple[str, dict]:
    """The terminal state of ``job`` and its result, J in that state alone (Q-6)."""
    return queue.only_result(job)


def stop_worker(proc: subprocess.Popen) -> int:
    proc.terminate()
    return proc.wait(timeout=30)


def modes(top: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every entry under ``top``: (kind, permission bits with setgid/sticky, uid, gid)."""
    tree: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(top))
            if rel.startswith(skip):
                continue
            st = path.lstat()
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if path.is_dir() else "file"
            tree[rel] = (kind, oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid)
    return tree


def same_but_root(one: str, other: str, root_one: Path, root_other: Path) -> bool:
    return one.replace(str(root_one), "ROOT") == other.replace(str(root_other), "ROOT")


@pytest.fixture
def top() -> Iterator[Path]:
    made = new_scratch_dir(SCRATCH)
    try:
        yield made
    finally:
        kill_processes_of(made)
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def make_host(_template: Path, top: Path) -> Iterator:
    """Hosts on copies of the bootstrapped template root (holding the queue of ``proj``)."""
    made: list[Host] = []

    def make(name: str = "storage") -> Host:
        host = Host(top, copy_of_root(_template, top / name))
        made.append(host)
        return host

    try:
        yield make
    finally:
        for host in made:
            host.teardown()


@pytest.fixture
def host(make_host) -> Host:
    return make_host()


def workspace(top: Path) -> Path:
    ws = top / "ws"
    ws.mkdir(mode=0o755, exist_ok=True)
    os.chown(ws, NOBODY.pw_uid, NOBODY.pw_gid)
    return ws


# ------------------------------------------------------------ bootstrap and the root itself


def test_an_agent_created_before_any_bootstrap_is_refused_and_no_root_is_made(top):
    root = top / "never-bootstrapped"
    req = {"name": "coder", "label": "coder_t", "tools": ["fs.read"]}
    made = ctx_run("agent", "create", "--storage", root, "-", input=json.dumps(req))
    assert made.rc == 1, made
    assert made.err.startswith("ctx: ENOENT: ") and "ctx bootstrap" in made.err, made
    assert not root.exists()
    # The order the message asks for works.
    assert ctx_run("bootstrap", "--storage", root).rc == 0
    again = ctx_run("agent", "create", "--storage", root, "-", input=json.dumps(req))
    assert again.rc == 0, again
    assert (root / "agent" / "coder").is_file() and (root / "agent" / "coder.d").is_dir()


def test_an_agent_created_in_an_empty_directory_is_refused_naming_bootstrap(top):
    root = top / "empty-root"
    root.mkdir()
    req = {"name": "coder", "label": "coder_t"}
    made = ctx_run("agent", "create", "--storage", root, "-", input=json.dumps(req))
    assert made.rc == 1, made
    assert list(root.iterdir()) == []
    assert made.err.startswith("ctx: ENOENT: ") and "bootstrap" in made.err, made


@pytest.mark.parametrize("shape", ["missing", "empty"])
def test_a_system_install_before_bootstrap_is_refused_naming_bootstrap(top, shape):
    root = top / "root"
    if shape == "empty":
        root.mkdir()
    manifest = tool_manifest(top / "manifests", "greet", GREET)
    r = ctx_run("object", "install", manifest, "--tier", "system", "--storage", root)
    assert r.rc == 1, r
    assert r.err.startswith("ctx: ENOENT: ") and "ctx bootstrap" in r.err, r
    assert (list(root.iterdir()) == []) if shape == "empty" else not root.exists()


def test_a_mount_before_bootstrap_is_refused_and_nothing_is_mounted(top):
    where = top / "view"
    where.mkdir()
    for root, errno in ((top / "missing-root", "ENOENT"), (top / "empty-root", "EINVAL")):
        if errno == "EINVAL":
            root.mkdir()
        try:
            r = ctx_run("mount", "--storage", root, where, timeout=30)
        finally:
            if mounted_at(where):
                ctx_run("umount", where)
        assert r.rc == 1, r
        assert r.err.startswith(f"ctx: {errno}: ") and "ctx bootstrap" in r.err, r
        assert not mounted_at(where) and list(where.iterdir()) == []
        assert (list(root.iterdir()) == []) if errno == "EINVAL" else not root.exists()


@pytest.fixture(scope="module")
def bootstrapped_then_space(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Order A, made once: ``ctx bootstrap``, then ``ctx shared create team``."""
    root = tmp_path_factory.mktemp("order-a") / "storage"
    assert ctx_run("bootstrap", "--storage", root).rc == 0
    assert ctx_run("shared", "create", "team", "--storage", root).rc == 0
    return root


@pytest.mark.parametrize(
    "maker",
    [
        ["shared", "create", "team"],
        ["queue", "init", "--project", "team"],
        ["queue", "init", "--queue", "{root}/shared/team/queue"],
    ],
    ids=["shared-create", "queue-init-project", "queue-init-queue-path"],
)
def test_a_space_made_before_bootstrap_gives_the_root_bootstrap_then_the_space_gives(
    top, bootstrapped_then_space, maker
):
    """Order A: bootstrap, then the space.  Order B: the space first, on a root that does not
    exist yet (docs/queue.md: it is first made whole, as ctx bootstrap makes it)."""
    first = bootstrapped_then_space
    second = top / "b"
    argv = [a.replace("{root}", str(second)) for a in maker]
    made = ctx_run(*argv, env=clean_env(CTX_STORAGE=str(second)))
    assert made.rc == 0, made
    assert {p.name for p in second.iterdir()} == CORE_ENTRIES
    assert modes(first) == modes(second)
    # Nothing is left for a bootstrap run afterwards: the two orders end the same.
    again = ctx_run("bootstrap", "--storage", second, "--json")
    assert again.rc == 0, again
    assert again.json()["created"] == [] and again.json()["repaired"] == [], again


def test_bootstrap_run_again_after_a_whole_setup_changes_nothing(host):
    """Every setup step done, a job worked and a call recorded; bootstrap again: nothing."""
    assert host.space("team", "--group", str(NOBODY.pw_gid)).rc == 0
    assert host.agent(tools=["greet", "hello"], shared={"team": ["read"]}).rc == 0
    assert host.install("greet", GREET).rc == 0
    assert host.install("hello", HELLO, "shared:team").rc == 0
    host.grant("greet")
    host.grant("hello", space="team")
    assert host.run("greet", "x").out == "greet x\n"
    queue = QueueCLI(host.storage, "team")
    job = queue.publish(request("hello", input={}))
    drained = host.ctx("queue", "work", "--project", "team", "--agent", "coder", "--drain")
    assert drained.rc == 0, drained
    assert result(queue, job)[0] == "done"
    before = snapshot(host.storage), modes(host.storage)
    again = host.ctx("bootstrap", "--json")
    assert again.rc == 0, again
    answer = again.json()
    assert (answer["created"], answer["repaired"], answer["problems"]) == ([], [], []), answer
    after = snapshot(host.storage), modes(host.storage)
    changed = {
        k
        for b, a in zip(before, after, strict=True)
        for k in set(b) | set(a)
        if b.get(k) != a.get(k)
    }
    # The lock file of a space's tier is made by the first install or bootstrap that looks
    # at the tier (docs/tools.md), here the space the template's queue init made: not a change.
    assert sorted(k for k in changed if not k.endswith("/tool/.install-lock")) == []


# ------------------------------------------------------------------- agents, spaces, tools


def test_an_agent_made_before_its_space_ends_as_one_made_after_it(make_host):
    early, late = make_host("early"), make_host("late")
    fields = {"tools": ["hello"], "shared": {"team": ["read", "write"]}}
    group = str(NOBODY.pw_gid)
    # early: the agent first, then its space
    made = early.agent(**fields)
    assert made.rc == 0, made
    warned = made.json()["warnings"]
    assert len(warned) == 1 and "ctx shared create team" in warned[0], made
    assert "/ctx/shared/team/tool" in early.show()["ctx_path"]  # on the path, found empty
    assert early.space("team", "--group", group).rc == 0
    # late: the space first, then the agent
    assert late.space("team", "--group", group).rc == 0
    made = late.agent(**fields)
    assert made.rc == 0 and made.json()["warnings"] == [], made
    for control in ("label", "policy", "identity", "model", "system.md", "prompt.template.md"):
        one = (early.storage / "agent" / "coder.d" / control).read_text()
        other = (late.storage / "agent" / "coder.d" / control).read_text()
        assert one == other, control
    assert same_but_root(
        json.dumps(early.show()), json.dumps(late.show()), early.storage, late.storage
    )


def test_a_tool_installed_after_the_agent_that_names_it_runs_as_in_the_other_order(make_host):
    early, late = make_host("early"), make_host("late")
    # early: agent, then the call (refused: no such tool), then install, then the grant
    assert early.agent(tools=["greet"]).rc == 0
    missing = early.run("greet", "a")
    assert missing.rc == 127, missing
    assert missing.err.startswith("ctx: ENOENT: no tool 'greet' on the CTX_PATH"), missing
    assert early.install("greet", GREET).rc == 0
    ungranted = early.run("greet", "a")
    assert ungranted.rc == 126 and "EACCES: step 6" in ungranted.err, ungranted
    early.grant("greet")
    # late: install, grant, agent
    assert late.install("greet", GREET).rc == 0
    late.grant("greet")
    assert late.agent(tools=["greet"]).rc == 0
    for h in (early, late):
        ran = h.run("greet", "a")
        assert (ran.rc, ran.out) == (0, "greet a\n"), ran
    assert (early.tool_dir("greet") / "policy").read_text() == (
        late.tool_dir("greet") / "policy"
    ).read_text()

    # Each call was recorded; the refused ones too, in the order they were made.
    def outcomes(h: Host) -> list[tuple[str, str]]:
        events = read_jsonl(h.home_session("coder", "default") / "events.jsonl")
        return [(e["type"], e["status"]) for e in events if e["type"] == "tool_result"]

    assert outcomes(early) == [("tool_result", "error")] * 2 + [("tool_result", "ok")]
    assert outcomes(late) == [("tool_result", "ok")]


def test_a_tool_policy_and_guard_written_before_the_tool_are_kept_by_its_install(host):
    """A tool's own policy and a guard hook written by hand before the first install (the
    administrator prepares the grant and its guard) are kept as they are, as a reinstall
    keeps them: the guard vetoes the first call."""
    assert host.agent(tools=["greet"]).rc == 0
    controls = host.tool_dir("greet")
    (controls / "hooks" / "pre.d").mkdir(parents=True)
    guard = controls / "hooks" / "pre.d" / "10-guard"
    guard.write_text("#!/bin/sh\necho not today >&2\nexit 1\n")
    guard.chmod(0o755)
    (controls / "policy").write_text("allow coder_t tool:greet execute\n")
    assert host.install("greet", GREET).rc == 0
    assert (controls / "policy").read_text() == "allow coder_t tool:greet execute\n"
    listed = host.ctx("object", "list", "--tier", "system", "--json")
    greet = [t for t in listed.json() if t["name"] == "greet"]
    assert greet and greet[0]["status"] == "available" and greet[0]["problems"] == [], listed
    vetoed = host.run("greet", "p")
    assert vetoed.rc == 126 and vetoed.out == "", vetoed
    assert vetoed.err.startswith("ctx: EACCES: hooks/pre.d/10-guard vetoed"), vetoed
    guard.unlink()
    ran = host.run("greet", "p")
    assert (ran.rc, ran.out) == (0, "greet p\n"), ran


def test_a_tool_policy_naming_a_label_before_its_agent_exists_grants_it_once_made(host):
    assert host.install("greet", GREET).rc == 0
    host.grant("greet", label="later_t")
    explained = host.ctx("policy", "explain", "later", "tool:greet", "execute")
    assert explained.rc == 1 and "ENOENT" in explained.err + explained.out, explained
    assert host.agent("later", tools=["greet"]).rc == 0
    ran = host.run("greet", "q", agent="later")
    assert (ran.rc, ran.out) == (0, "greet q\n"), ran


def test_policy_explain_before_and_after_the_install_names_what_is_missing(make_host):
    early, late = make_host("early"), make_host("late")
    assert early.agent(tools=["greet"]).rc == 0
    before = early.ctx("policy", "explain", "coder", "tool:greet", "execute", "--json")
    assert before.rc == 1, before
    assert (before.json()["step"], before.json()["errno"]) == (2, "ENOENT"), before
    assert early.install("greet", GREET).rc == 0
    early.grant("greet")
    assert late.install("greet", GREET).rc == 0
    late.grant("greet")
    assert late.agent(tools=["greet"]).rc == 0
    answers = []
    for h in (early, late):
        r = h.ctx("policy", "explain", "coder", "tool:greet", "execute", "--json")
        assert r.rc == 0 and r.json()["allowed"] is True, r
        answers.append(r.out.replace(str(h.storage), "ROOT"))
    assert answers[0] == answers[1]


def test_a_space_tool_installed_before_or_after_the_space_gets_its_group_ends_the_same(
    make_host,
):
    group = str(NOBODY.pw_gid)
    grouped_first, installed_first = make_host("grouped-first"), make_host("installed-first")
    assert grouped_first.space("team", "--group", group).rc == 0
    assert grouped_first.install("hello", HELLO, "shared:team").rc == 0
    assert installed_first.space("team").rc == 0
    assert installed_first.install("hello", HELLO, "shared:team").rc == 0
    assert installed_first.space("team", "--group", group).rc == 0
    one = modes(grouped_first.storage / "shared" / "team")
    other = modes(installed_first.storage / "shared" / "team")
    # Regrouped afterwards, every entry is the group's (the regroup's promise) ...
    assert sorted(k for k, v in other.items() if v[3] != NOBODY.pw_gid) == []
    # ... and installed into the grouped space, every entry should be too (setgid space).
    assert sorted(k for k, v in one.items() if v[3] != NOBODY.pw_gid) == []
    assert one == other


def test_queue_init_and_shared_create_in_either_order_give_the_same_space(make_host):
    group = str(NOBODY.pw_gid)
    queue_first, space_first = make_host("queue-first"), make_host("space-first")
    assert queue_first.ctx("queue", "init", "--project", "team").rc == 0
    regrouped = queue_first.space("team", "--group", group)
    assert regrouped.rc == 0 and "regrouped" in regrouped.out, regrouped
    assert space_first.space("team", "--group", group).rc == 0
    ready = space_first.ctx("queue", "init", "--project", "team")
    assert ready.rc == 0 and "ready" in ready.out, ready
    one = modes(queue_first.storage / "shared" / "team")
    other = modes(space_first.storage / "shared" / "team")
    assert one == other
    assert one["queue"] == ("dir", "0o3770", 0, NOBODY.pw_gid)
    assert one["tool"] == ("dir", "0o2750", 0, NOBODY.pw_gid)


def test_a_mount_source_inside_a_space_not_made_yet_works_once_it_is(make_host):
    early, late = make_host("early"), make_host("late")
    group = str(NOBODY.pw_gid)

    def fields(h: Host) -> dict:
        data = h.storage / "shared" / "team" / "data"
        return {"tools": ["fs.stat"], "shared": {"team": "read write"},
                "mount": [[str(data), "/data", "rw"]]}  # fmt: skip

    made = early.agent(**fields(early))
    assert made.rc == 0, made
    assert any("does not exist" in w and "/data" in w for w in made.json()["warnings"]), made
    assert early.space("team", "--group", group).rc == 0
    assert late.space("team", "--group", group).rc == 0
    assert late.agent(**fields(late)).rc == 0
    stats = []
    for h in (early, late):
        h.grant("fs.stat")
        shown = h.show()
        assert shown["withheld_mounts"] == [] and shown["problems"] == [], shown
        assert shown["cwd"] == "/data", shown
        out = h.native("fs.stat", payload={"path": "/data"})
        assert out["status"] == "ok", out
        stats.append((out["output"]["mode"], out["output"]["gid"]))
    assert stats[0] == stats[1]


def test_a_call_recorded_in_a_space_not_made_yet_is_refused_and_makes_nothing(host):
    assert host.agent(tools=["greet"], shared={"team": "read write"}).rc == 0
    assert host.install("greet", GREET).rc == 0
    host.grant("greet")
    refused = host.run("greet", "z", options=("--project", "team"))
    assert refused.rc == 126, refused
    assert refused.err.startswith("ctx: ENOENT: ") and "ctx shared create team" in refused.err
    assert not (host.storage / "shared" / "team").exists()
    assert host.space("team", "--group", str(NOBODY.pw_gid)).rc == 0
    ran = host.run("greet", "z", options=("--project", "team"))
    assert (ran.rc, ran.out) == (0, "greet z\n"), ran
    session = host.storage / "shared" / "team" / "agent" / "coder" / "session" / "default"
    kinds = [e["type"] for e in read_jsonl(session / "events.jsonl")]
    assert kinds.count("tool_call") == 1 and kinds.count("tool_result") == 1, kinds


def test_a_space_session_recorded_before_or_after_the_agent_joins_the_group_ends_the_same(
    make_host,
):
    """The space made in root's group first: the agent's call recorded there is refused at
    step 2 and leaves nothing; once the space is regrouped it is recorded, as in a space
    grouped from the start."""
    group = str(NOBODY.pw_gid)
    late, early = make_host("late-group"), make_host("early-group")
    for h in (late, early):
        assert h.agent(tools=["fs.stat"], shared={"team": "read write"}).rc == 0
        h.grant("fs.stat")
    assert late.space("team").rc == 0
    refused = late.run("fs.stat", "/ctx", options=("--project", "team"))
    assert refused.rc == 126 and refused.err.startswith("ctx: EACCES: step 2"), refused
    assert os.listdir(late.storage / "shared" / "team" / "agent") == []
    assert late.space("team", "--group", group).rc == 0
    assert early.space("team", "--group", group).rc == 0
    for h in (late, early):
        ran = h.run("fs.stat", "/ctx", options=("--project", "team"))
        assert ran.rc == 0, ran
    one, other = (modes(h.storage / "shared" / "team" / "agent") for h in (late, early))
    assert one == other
    events = "coder/session/default/events.jsonl"
    assert one[events] == ("file", "0o660", NOBODY.pw_uid, NOBODY.pw_gid)


def test_a_space_tool_installed_before_its_space_is_refused_naming_shared_create(host):
    r = host.install("hello", HELLO, "shared:team")
    assert r.rc == 1, r
    assert r.err.startswith("ctx: ENOENT: ") and "ctx shared create team" in r.err, r
    assert not (host.storage / "shared" / "team").exists()
    assert host.space("team").rc == 0
    assert host.install("hello", HELLO, "shared:team").rc == 0


def test_the_home_session_is_the_same_whichever_command_makes_it_first(make_host):
    by_run, by_worker = make_host("by-run"), make_host("by-worker")
    for h in (by_run, by_worker):
        assert h.agent(tools=["greet"]).rc == 0
        assert h.install("greet", GREET).rc == 0
        h.grant("greet")
    assert by_run.run("greet", options=("--session", "worker")).rc == 0
    queue = QueueCLI(by_worker.storage, "proj")
    queue.publish(request("greet", input={}))
    worked = by_worker.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert worked.rc == 0, worked
    home = str(NOBODY.pw_uid)
    one, other = (modes(h.storage / "home" / home) for h in (by_run, by_worker))
    assert one == other
    assert one["agent/coder/session/worker"] == ("dir", "0o700", NOBODY.pw_uid, NOBODY.pw_gid)
    events = "agent/coder/session/worker/events.jsonl"
    assert one[events] == ("file", "0o600", NOBODY.pw_uid, NOBODY.pw_gid)


# -------------------------------------------------------------------------------- workers


def test_a_worker_started_before_its_space_is_refused_and_makes_no_space(host):
    assert host.agent(tools=["greet"]).rc == 0
    refused = host.ctx("queue", "work", "--project", "team", "--agent", "coder", "--drain")
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: ENOENT: ")
    assert "ctx queue init --project team" in refused.err, refused
    assert not (host.storage / "shared" / "team").exists()
    # In the order it names, the same worker runs the job.
    assert host.space("team").rc == 0
    assert host.install("greet", GREET).rc == 0
    host.grant("greet")
    queue = QueueCLI(host.storage, "team")
    job = queue.publish(request("greet", input={}))
    worked = host.ctx("queue", "work", "--project", "team", "--agent", "coder", "--drain")
    assert worked.rc == 0, worked
    assert result(queue, job)[0] == "done"


def test_a_worker_started_before_its_agent_is_refused_and_claims_nothing(host):
    queue = QueueCLI(host.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/ctx"}))
    before = snapshot(queue.dir)
    refused = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: ENOENT: there is no agent 'coder'"), refused
    assert "ctx agent create" in refused.err, refused
    assert snapshot(queue.dir) == before and queue.state(job) == "pending"
    assert host.agent(tools=["fs.stat"]).rc == 0
    host.grant("fs.stat")
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert worked.rc == 0, worked
    assert result(queue, job)[0] == "done"


def test_a_running_worker_picks_up_a_tool_installed_and_granted_after_it_started(host):
    assert host.agent(tools=["greet"]).rc == 0
    queue = QueueCLI(host.storage, "proj")
    proc = host.worker("proj")
    jobs = []

    def job_ends() -> tuple[str, dict]:
        job = queue.publish(request("greet", input={}))
        jobs.append(job)
        assert wait_for(lambda: finished(proc, job) is not None, 20), worker_events(proc)
        return result(queue, job)

    state, res = job_ends()  # no such tool yet
    assert state == "failed" and res["error"]["error"] == "ENOENT", res
    assert res["error"]["stage"] == "resolve", res
    assert host.install("greet", GREET).rc == 0
    state, res = job_ends()  # installed, the tool's policy grants nothing yet
    assert state == "failed" and (res["error"]["error"], res["error"]["step"]) == ("EACCES", 6)
    host.grant("greet")
    state, res = job_ends()
    assert state == "done" and res["output"] == "greet native\n", res
    assert proc.poll() is None, worker_stderr(proc)
    assert stop_worker(proc) == 0
    starts = [e for e in worker_events(proc) if e.get("event") == "start"]
    assert len(starts) == 1  # one worker, never restarted


def test_a_running_worker_finds_a_space_tool_made_after_it_started(host):
    assert host.agent(tools=["hello"], shared={"team": ["read"]}).rc == 0
    queue = QueueCLI(host.storage, "proj")
    proc = host.worker("proj")
    assert host.space("team", "--group", str(NOBODY.pw_gid)).rc == 0
    assert host.install("hello", HELLO, "shared:team").rc == 0
    host.grant("hello", space="team")
    job = queue.publish(request("hello", input={}))
    assert wait_for(lambda: finished(proc, job) is not None, 20), worker_events(proc)
    state, res = result(queue, job)
    assert state == "done" and res["output"] == "hello from the space\n", res
    assert stop_worker(proc) == 0


def test_regrouping_the_space_under_a_running_worker_keeps_it_working(host):
    assert host.agent(tools=["greet"]).rc == 0
    assert host.install("greet", GREET).rc == 0
    host.grant("greet")
    queue = QueueCLI(host.storage, "proj")
    proc = host.worker("proj")
    first = queue.publish(request("greet", input={}))
    assert wait_for(lambda: finished(proc, first) is not None, 20), worker_events(proc)
    regrouped = host.space("proj", "--group", str(NOBODY.pw_gid))
    assert regrouped.rc == 0 and "regrouped" in regrouped.out, regrouped
    again = host.ctx("queue", "init", "--project", "proj")
    assert again.rc == 0, again
    second = queue.publish(request("greet", input={}))
    assert wait_for(lambda: finished(proc, second) is not None, 20), worker_events(proc)
    assert [result(queue, j)[0] for j in (first, second)] == ["done", "done"]
    assert proc.poll() is None, worker_stderr(proc)
    assert stop_worker(proc) == 0
    queue.assert_settled()


def test_bootstrap_run_again_under_a_running_worker_and_its_job(host):
    assert host.agent(tools=["nap"]).rc == 0
    assert host.install("nap", NAP).rc == 0
    host.grant("nap")
    queue = QueueCLI(host.storage, "proj")
    proc = host.worker("proj")
    job = queue.publish(request("nap", input={}))
    assert wait_for(lambda: queue.state(job) == "claimed", 20), worker_events(proc)
    again = host.ctx("bootstrap", "--json")
    assert again.rc == 0, again
    assert again.json()["created"] == [] and again.json()["repaired"] == [], again
    assert wait_for(lambda: finished(proc, job) is not None, 20), worker_events(proc)
    state, res = result(queue, job)
    assert state == "done" and res["output"] == "napped\n", res
    later = queue.publish(request("nap", input={}))
    assert wait_for(lambda: finished(proc, later) is not None, 20), worker_events(proc)
    assert result(queue, later)[0] == "done"
    assert stop_worker(proc) == 0


def test_a_space_made_again_under_a_running_worker_stops_it_leaving_the_job_pending(host):
    assert host.agent(tools=["greet"]).rc == 0
    assert host.space("team").rc == 0
    proc = host.worker("team")
    assert wait_for(lambda: any(e.get("event") == "start" for e in worker_events(proc)), 20)
    shutil.rmtree(host.storage / "shared" / "team")
    assert host.space("team").rc == 0
    queue = QueueCLI(host.storage, "team")
    job = queue.publish(request("greet", input={}))
    assert proc.wait(timeout=20) == 1
    assert "ctx: ESTALE: " in worker_stderr(proc), worker_stderr(proc)
    stop = [e for e in worker_events(proc) if e.get("event") == "stop"]
    assert stop and stop[0]["failure"].startswith("ESTALE"), worker_events(proc)
    assert queue.state(job) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


def test_a_worker_before_bootstrap_of_this_version_claims_nothing_until_it_runs(host):
    """README "Upgrading": until bootstrap has run, workers refuse to start (EINVAL, nothing
    claimed).  A core tool carrying another version's stamp stands in for an older root."""
    assert host.agent(tools=["fs.stat"]).rc == 0
    host.grant("fs.stat")
    core = host.storage / "tool" / "fs.stat"
    data = core.read_bytes()
    mark = data.index(b"#cortexfs-bundle ") + len(b"#cortexfs-bundle ")
    other = b"0" if data[mark : mark + 1] != b"0" else b"1"
    core.write_bytes(data[:mark] + other + data[mark + 1 :])
    queue = QueueCLI(host.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/ctx"}))
    before = snapshot(queue.dir)
    refused = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: EINVAL: ") and "ctx bootstrap" in refused.err, refused
    assert snapshot(queue.dir) == before
    repaired = host.ctx("bootstrap")
    assert repaired.rc == 0 and "repaired  tool/fs.stat" in repaired.out, repaired
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert worked.rc == 0, worked
    assert result(queue, job)[0] == "done"


# --------------------------------------------------------------------------------- mounts


def test_a_host_mount_started_before_any_agent_shows_what_is_made_after(host):
    where = host.top / "host-view"
    where.mkdir()
    with serving(host.storage, where):
        assert os.listdir(where / "agent") == []
        assert host.agent(tools=["greet"]).rc == 0
        assert host.space("team").rc == 0
        assert wait_for(lambda: {"coder", "coder.d"} <= set(os.listdir(where / "agent")), 10)
        assert (where / "agent" / "coder.d" / "label").read_text() == "coder_t\n"
        assert wait_for(lambda: "team" in os.listdir(where / "shared"), 10)
        assert sorted(os.listdir(where / "shared" / "team")) == sorted(
            os.listdir(host.storage / "shared" / "team")
        )


def test_a_view_of_an_agent_not_made_yet_is_refused_and_mounts_nothing(host):
    where = host.top / "coder-view"
    where.mkdir()
    try:
        refused = ctx_run("mount", "--storage", host.storage, "--as", "coder", where, timeout=30)
    finally:
        if mounted_at(where):
            ctx_run("umount", where)
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: ENOENT: there is no agent 'coder'"), refused
    assert "ctx agent create" in refused.err, refused
    assert not mounted_at(where) and os.listdir(where) == []
    assert host.agent(tools=["fs.read"]).rc == 0
    with serving(host.storage, where, "--as", "coder"):
        assert set(os.listdir(where)) == CORE_ENTRIES


def test_a_view_whose_mount_point_comes_later_is_refused_with_the_mkdir_to_run(host):
    assert host.agent(tools=["fs.read"]).rc == 0
    where = host.top / "not-yet"
    try:
        refused = ctx_run("mount", "--storage", host.storage, "--as", "coder", where, timeout=30)
    finally:
        if mounted_at(where):
            ctx_run("umount", where)
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: ENOENT: ") and f"mkdir {where}" in refused.err, refused
    assert not os.path.lexists(where)
    where.mkdir()  # what it said to do
    with serving(host.storage, where, "--as", "coder"):
        assert set(os.listdir(where)) == CORE_ENTRIES


def test_a_view_started_before_its_tools_and_space_matches_one_started_after(host):
    """The view follows what is made and granted after it started (within a second or so,
    docs/mount.md) and ends as a view started once everything is there."""
    assert host.agent(tools=["greet", "hello"], shared={"team": ["read"]}).rc == 0
    early = host.top / "early-view"
    early.mkdir()
    with serving(host.storage, early, "--as", "coder"):
        assert "greet" not in os.listdir(early / "tool")
        assert os.listdir(early / "shared") == ["cortexfs-docs"]
        assert host.install("greet", GREET).rc == 0
        host.grant("greet")
        assert host.space("team", "--group", str(NOBODY.pw_gid)).rc == 0
        assert host.install("hello", HELLO, "shared:team").rc == 0
        host.grant("hello", space="team")
        assert wait_for(lambda: "greet" in os.listdir(early / "tool"), 10)
        assert wait_for(lambda: "team" in os.listdir(early / "shared"), 10)
        late = host.top / "late-view"
        late.mkdir()
        with serving(host.storage, late, "--as", "coder"):
            for sub in ("tool", "shared", "shared/team", "shared/team/tool", "agent"):
                assert sorted(os.listdir(early / sub)) == sorted(os.listdir(late / sub)), sub


def test_bootstrap_run_again_under_running_views_leaves_them_serving_the_same(host):
    assert host.agent(tools=["greet"]).rc == 0
    assert host.install("greet", GREET).rc == 0
    host.grant("greet")
    plain, agent_view = host.top / "plain", host.top / "agent-view"
    plain.mkdir()
    agent_view.mkdir()
    with serving(host.storage, plain), serving(host.storage, agent_view, "--as", "coder"):
        listed = {p: sorted(os.listdir(p / "tool")) for p in (plain, agent_view)}
        again = host.ctx("bootstrap")
        assert again.rc == 0 and "nothing to do" in again.out, again
        assert {p: sorted(os.listdir(p / "tool")) for p in (plain, agent_view)} == listed
        assert "greet" in listed[agent_view] and "fs.read" not in listed[agent_view]
        assert (agent_view / "tool" / "greet.d" / "name").read_text().strip() == "greet"


# ------------------------------------------------------------------------------ terminals


def test_a_terminal_whose_mount_source_comes_later_is_refused_then_starts(host):
    ws = workspace(host.top)
    data = host.top / "later-data"
    made = host.agent(tools=["fs.read"], mount=[[str(data), "/data", "ro"]])
    assert made.rc == 0, made
    assert any(str(data) in w and "does not exist" in w for w in made.json()["warnings"])
    refused = host.start("s1", cwd=ws)
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: ENOENT: ") and str(data) in refused.err, refused
    assert host.show()["terminals"] == []
    log = read_jsonl(host.storage / "agent" / "coder.d" / "log")
    assert [e["type"] for e in log] == ["agent.created"]
    assert not (host.home_session("coder", "s1") / "terminal").exists()
    data.mkdir(mode=0o755)
    started = host.start("s1", cwd=ws)
    assert started.rc == 0, started
    assert [t["session"] for t in host.show()["terminals"]] == ["s1"]


def test_a_terminal_whose_workspace_comes_later_is_refused_up_front_then_starts(host):
    assert host.agent(tools=["fs.read"]).rc == 0
    ws = host.top / "later-ws"
    refused = host.ctx("agent", "start", "coder", "--session", "s1", "--workspace", ws)
    assert refused.rc == 2, refused
    assert "EINVAL" in refused.err and str(ws) in refused.err, refused
    assert host.show()["terminals"] == [] and not os.path.lexists(ws)
    assert not (host.home_session("coder", "s1")).exists()
    ws.mkdir(mode=0o755)
    os.chown(ws, NOBODY.pw_uid, NOBODY.pw_gid)
    started = host.ctx("agent", "start", "coder", "--session", "s1", "--workspace", ws, "--json")
    assert started.rc == 0, started
    host.terminals.append(("coder", "s1"))
    assert started.json()["workspace"] == str(ws)
    assert [t["session"] for t in host.show()["terminals"]] == ["s1"]


def test_a_terminal_started_before_its_tools_and_space_runs_them_once_made(host):
    ws = workspace(host.top)
    assert host.agent(tools=["greet", "hello"], shared={"team": ["read"]}).rc == 0
    started = host.start("s1", cwd=ws)
    assert started.rc == 0, started
    term = Raw(Path(started.json()["listening_at"]), b"attach\n")
    try:
        assert term.shows("coder$ "), term.text()
        assert "not a tool on CTX_PATH" in term.answer("greet t")
        assert host.install("greet", GREET).rc == 0
        host.grant("greet")
        assert host.space("team", "--group", str(NOBODY.pw_gid)).rc == 0
        assert host.install("hello", HELLO, "shared:team").rc == 0
        host.grant("hello", space="team")
        assert wait_for(lambda: term.answer("greet t") == "greet t\n", 10), term.text()[-600:]
        assert term.answer("hello") == "hello from the space\n", term.text()[-600:]
        assert term.answer("which hello") == "/ctx/shared/team/tool/hello\n"
    finally:
        term.close()
    assert host.run("greet", "t").out == "greet t\n"  # the same as outside the terminal


def test_bootstrap_run_again_under_a_running_terminal_changes_nothing_it_uses(host):
    ws = workspace(host.top)
    assert host.agent(tools=["greet"]).rc == 0
    assert host.install("greet", GREET).rc == 0
    host.grant("greet")
    started = host.start("s1", cwd=ws)
    assert started.rc == 0, started
    entry = (host.storage / "agent" / "coder").read_bytes()
    tsh = (host.storage / "bin" / "tsh").read_bytes()
    term = Raw(Path(started.json()["listening_at"]), b"attach\n")
    try:
        assert term.shows("coder$ "), term.text()
        assert term.answer("greet before") == "greet before\n"
        again = host.ctx("bootstrap")
        assert again.rc == 0 and "nothing to do" in again.out, again
        assert term.answer("greet after") == "greet after\n"
    finally:
        term.close()
    assert (host.storage / "agent" / "coder").read_bytes() == entry
    assert (host.storage / "bin" / "tsh").read_bytes() == tsh
    stopped = host.ctx("agent", "stop", "coder", "--session", "s1")
    assert stopped.rc == 0, stopped
    host.terminals.clear()
    events = read_jsonl(host.home_session("coder", "s1") / "events.jsonl")
    results = [e for e in events if e["type"] == "tool_result" and e["object"] == "tool/greet"]
    assert [e["status"] for e in results] == ["ok", "ok"]


def test_a_terminal_and_a_host_mount_started_in_either_order_both_serve(host):
    ws = workspace(host.top)
    assert host.agent(tools=["greet"]).rc == 0
    assert host.install("greet", GREET).rc == 0
    host.grant("greet")
    where = host.top / "host-view"
    where.mkdir()
    with serving(host.storage, where):
        started = host.start("s1", cwd=ws)  # the host mount first, then the terminal
        assert started.rc == 0, started
        assert host.ctx("agent", "stop", "coder", "--session", "s1").rc == 0
        host.terminals.clear()
    started = host.start("s2", cwd=ws)  # the terminal first, then the host mount
    assert started.rc == 0, started
    with serving(host.storage, where):
        assert "coder" in os.listdir(where / "agent")
        term = Raw(Path(started.json()["listening_at"]), b"attach\n")
        try:
            assert term.shows("coder$ "), term.text()
            assert term.answer("greet m") == "greet m\n"
        finally:
            term.close()


def test_agent_list_and_show_agree_whichever_order_built_the_setup(make_host):
    """The full setup in two orders: (space, tools, grants, agent) and (agent, grants of the
    agent's side only, tools, space, the tools' grants)."""
    group = str(NOBODY.pw_gid)
    fields = {"tools": ["greet", "hello"], "shared": {"team": ["read", "write"]}}
    forward, backward = make_host("forward"), make_host("backward")
    assert forward.space("team", "--group", group).rc == 0
    assert forward.install("greet", GREET).rc == 0
    assert forward.install("hello", HELLO, "shared:team").rc == 0
    forward.grant("greet")
    forward.grant("hello", space="team")
    assert forward.agent(**fields).rc == 0
    assert backward.agent(**fields).rc == 0
    assert backward.install("greet", GREET).rc == 0
    assert backward.space("team", "--group", group).rc == 0
    assert backward.install("hello", HELLO, "shared:team").rc == 0
    backward.grant("hello", space="team")
    backward.grant("greet")
    views = []
    for h in (forward, backward):
        listed = h.ctx("agent", "list", "--json")
        assert listed.rc == 0, listed
        views.append((listed.out, json.dumps(h.show()).replace(str(h.storage), "ROOT")))
        for tool in ("greet", "hello"):
            out = h.native(tool)
            assert out["status"] == "ok", out
    assert views[0] == views[1]
    assert modes(forward.storage / "agent") == modes(backward.storage / "agent")
