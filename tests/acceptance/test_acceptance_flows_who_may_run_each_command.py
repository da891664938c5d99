"""Who may run each ``ctx`` command: a permission matrix of callers against commands (SPEC
P-5 step 1, T-3, A-2, A-3, Q-1..Q-5, S-1, S-6, X-1, F-1, R-4; docs/tools.md "Running a tool"
and "Identity", docs/workers.md "Who may start one", docs/queue.md "A queue shared by a
group", docs/sessions.md, docs/mount.md; the ``--help`` of every command).

The callers are real users of the host, each running the installed ``ctx`` with its own uid
and the groups the group database gives it:

* root, the host administrator of every storage root;
* the storage owner: a user who bootstrapped a root of their own with ``--storage``;
* a member of a shared space's group;
* an outsider, in no group of the space;
* the uid an agent runs as;
* a user with no home under the root (the storage owner, on root's root).

Each command is either allowed, and then gives the caller what it gives root, or refused with
``ctx: EACCES`` / ``EPERM`` naming what was refused and why; a refused command leaves the
storage root byte for byte as it was (no session, log line, temp file or directory made), and
nothing under ``/run`` for a terminal that was not started."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    serving,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, members_of, process_of, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as several users")

SCRATCH = scratch_top(__file__)
GROUP = "ctxwho-g"
MEMBER, OUTSIDER, OWNER, AGENT_USER = "ctxwho-m", "ctxwho-o", "ctxwho-u", "ctxwho-a"
SPACE = "team"
WAITING = "waiting.req.json"  # a job root publishes in the space's queue and nobody claims
TRACEBACK = "Traceback (most recent call last)"
RUNTIME = Path("/run/cortexfs/terminal")
PATH = "/usr/local/bin:/usr/bin:/bin"
REQUEST = json.dumps({"tool": "fs.stat", "input": {"path": "/ctx"}})
ADMIN_ONLY = "only the host administrator (root, or uid {uid} who owns {root}) may {action}"

needs_terminals = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)


# ------------------------------------------------------------------------------ the people


@dataclass(frozen=True)
class People:
    member: UnprivilegedUser  # in GROUP, the space's group
    outsider: UnprivilegedUser
    owner: UnprivilegedUser  # owns a storage root of their own; no home under root's
    agent: UnprivilegedUser  # the uid root's agent ``coder`` runs as
    gid: int

    def others(self) -> list[UnprivilegedUser]:
        """Every caller but root: on root's storage root the member, the outsider, the agent's
        uid and a user without a home there (the owner of another root)."""
        return [self.member, self.outsider, self.agent, self.owner]

    def non_members(self) -> list[UnprivilegedUser]:
        return [user for user in self.others() if user is not self.member]


@pytest.fixture(scope="module")
def people() -> People:
    """The four users (system users, made on first use and kept), only the member in GROUP."""
    (member,), gid = members_of(GROUP, MEMBER)
    outsider, owner, agent = users_named(OUTSIDER, OWNER, AGENT_USER)
    if any(gid in user.groups for user in (outsider, owner, agent)):
        pytest.skip(f"group {GROUP} holds more users than {MEMBER}")
    return People(member, outsider, owner, agent, gid)


# ------------------------------------------------------------------------------ the world


@dataclass
class World:
    """Root's storage root ``storage`` (a space ``team`` of GROUP, agents ``coder`` running as
    the agent's uid and ``mine`` running as the member), and the owner's own root
    ``owner_root`` when one was made; every caller has a HOME of its own below ``top``."""

    top: Path
    people: People
    storage: Path | None = None
    owner_root: Path | None = None

    @property
    def space(self) -> Path:
        assert self.storage is not None
        return self.storage / "shared" / SPACE

    @property
    def queue(self) -> Path:
        return self.space / "queue"

    def home(self, user: UnprivilegedUser) -> Path:
        home = self.top / f"home-{user.name}"
        if not home.exists():
            home.mkdir(mode=0o755)
            os.chown(home, user.uid, user.gid)
        return home

    def as_(
        self,
        user: UnprivilegedUser,
        *args: str | os.PathLike,
        stdin: str = "",
        storage: Path | None = None,
        cwd: Path | None = None,
    ) -> Run:
        """``ctx ARGS`` as ``user`` (its uid, gid and database groups, umask 022), from a
        login-like environment naming ``storage`` (default: root's root) in CTX_STORAGE."""
        env = {
            "PATH": PATH,
            "HOME": str(self.home(user)),
            "USER": user.name,
            "LOGNAME": user.name,
            "LANG": "C.UTF-8",
        }
        where = storage or self.storage
        if where is not None:
            env["CTX_STORAGE"] = str(where)
        done = subprocess.run(
            [*CTX_ARGV, *map(str, args)],
            input=stdin,
            user=user.uid,
            group=user.gid,
            extra_groups=user.groups,
            umask=0o022,
            env=env,
            cwd=cwd or self.home(user),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Run([str(a) for a in args], done.returncode, done.stdout, done.stderr)

    def sh_as(self, user: UnprivilegedUser, script: str, *args: str | os.PathLike) -> None:
        done = subprocess.run(
            ["/bin/sh", "-c", script, "sh", *map(str, args)],
            user=user.uid,
            group=user.gid,
            extra_groups=user.groups,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done

    def root(self, *args: str | os.PathLike, stdin: str = "", storage: Path | None = None) -> Run:
        where = storage or self.storage
        return ctx_run(*args, input=stdin, env=clean_env(CTX_STORAGE=str(where)))

    def root_ok(self, *args: str | os.PathLike, stdin: str = "", storage: Path | None = None):
        done = self.root(*args, stdin=stdin, storage=storage)
        assert done.rc == 0, done
        return done

    def manifest(self, name: str, program: str = "#!/bin/sh\necho ran\n") -> Path:
        """A v2 manifest every uid may read, in ``top/manifests``."""
        path = tool_manifest(self.top / "manifests", name, program)
        for entry in (path.parent, path, path.with_name(f"{name}.sh")):
            entry.chmod(0o755 if entry.is_dir() else 0o644)
        return path


def _build_roots_root(world: World, template: Path, *, whole: bool = True) -> None:
    """Root's storage root: a copy of the bootstrapped template, the space ``team`` of GROUP,
    agent ``coder`` (the agent's uid; fs.stat granted in both policies) and the job WAITING
    pending in the space's queue.  ``whole``: also one call of coder recorded in its home,
    agent ``mine`` (the member's uid; fs.stat and the space's tool ``probe``, ``team`` read
    and write) and one call of mine recorded in the space."""
    storage = world.storage = copy_of_root(template, world.top / "storage")
    world.root_ok("shared", "create", SPACE, "--group", GROUP)
    coder = {"name": "coder", "label": "coder_t", "tools": ["fs.stat"]}
    world.root_ok("agent", "create", "--user", AGENT_USER, "-", stdin=json.dumps(coder))
    with (storage / "tool" / "fs.stat.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:fs.stat execute\nallow mine_t tool:fs.stat execute\n")
    world.root_ok("queue", "publish", "--project", SPACE, "--name", WAITING, "-", stdin=REQUEST)
    if not whole:
        return
    mine = {
        "name": "mine",
        "label": "mine_t",
        "tools": ["fs.stat", "probe"],
        "shared": {SPACE: ["read", "write"]},
    }
    world.root_ok("agent", "create", "--user", MEMBER, "-", stdin=json.dumps(mine))
    world.root_ok("object", "install", world.manifest("probe"), "--tier", f"shared:{SPACE}")
    with (world.space / "tool" / "probe.d" / "policy").open("a") as policy:
        policy.write("allow mine_t tool:probe execute\n")
    world.root_ok("run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/ctx"}')
    mines = ("run", "--agent", "mine", "--project", SPACE, "--native", "fs.stat")
    world.root_ok(*mines, stdin='{"path": "/ctx/shared"}')


def _build_owners_root(world: World, template: Path) -> None:
    """The owner's own root ``HOME/root``: the owner's bootstrapped ``template`` copied there
    and given to the owner whole, as their own bootstrap would have made it, with agent
    ``own`` (running as the owner) allowed fs.stat in both policies, one call of it recorded."""
    owner = world.people.owner
    root = world.owner_root = copy_of_root(template, world.home(owner) / "root")
    for entry in (root, *root.rglob("*")):
        os.lchown(entry, owner.uid, owner.gid)
    request = json.dumps({"name": "own", "label": "own_t", "tools": ["fs.stat"]})
    created = world.as_(owner, "agent", "create", "-", stdin=request, storage=root)
    assert created.rc == 0, created
    policy = root / "tool" / "fs.stat.d" / "policy"
    world.sh_as(owner, 'echo "allow own_t tool:fs.stat execute" >> "$1"', policy)
    ran = world.as_(
        owner,
        "run",
        "--agent",
        "own",
        "--native",
        "fs.stat",
        stdin='{"path": "/ctx"}',
        storage=root,
    )
    assert ran.rc == 0, ran


@contextlib.contextmanager
def _world(people: People) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w")
    try:
        yield World(top, people)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def owners_template(people: People) -> Iterator[Path]:
    """A root the owner bootstrapped with ``--storage`` (R-5), as the owner: nothing more."""
    with _world(people) as made:
        root = made.home(people.owner) / "root"
        booted = made.as_(people.owner, "bootstrap", "--storage", root)
        assert booted.rc == 0, booted
        assert {os.lstat(p).st_uid for p in (root, *root.rglob("*"))} == {people.owner.uid}
        yield root


@pytest.fixture(scope="module")
def world(_template: Path, owners_template: Path, people: People) -> Iterator[World]:
    """Both roots, shared by the tests of this file that change nothing in them (each checks
    that itself, with a snapshot)."""
    with _world(people) as made:
        _build_roots_root(made, _template)
        _build_owners_root(made, owners_template)
        yield made


@pytest.fixture
def fresh(_template: Path, people: People) -> Iterator[World]:
    """Root's root alone (space, coder, WAITING; not the rest), for a test that changes it."""
    with _world(people) as made:
        _build_roots_root(made, _template, whole=False)
        yield made


@pytest.fixture
def fresh_owner(owners_template: Path, people: People) -> Iterator[World]:
    """The owner's root alone, for a test that changes it."""
    with _world(people) as made:
        _build_owners_root(made, owners_template)
        yield made


# ------------------------------------------------------------------------------ checks


def assert_refused(done: Run, word: str, *fragments: str, rc: int = 1) -> None:
    """Exit ``rc``, ``ctx: WORD: …`` on stderr holding each fragment; nothing on stdout but,
    with ``--json``, the same error as one object (README)."""
    assert done.rc == rc, done
    assert done.err.startswith(f"ctx: {word}: "), done
    for fragment in fragments:
        assert fragment in done.err, (fragment, done)
    if "--json" in done.argv:
        error = done.json()
        assert (error["error"], f"ctx: {word}: {error['message']}\n") == (word, done.err), done
    else:
        assert done.out == "", done
    assert TRACEBACK not in done.err, done


def frames(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def runtime_of(storage: Path) -> Path:
    """Where the terminals of ``storage`` keep their runtime files (docs/tools.md: the first
    16 hex digits of the SHA-256 of the root's real path)."""
    key = hashlib.sha256(os.fsencode(os.path.realpath(storage))).hexdigest()[:16]
    return RUNTIME / key


def owner_of(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ============================================================ anyone's


def test_reading_commands_answer_every_caller_as_they_answer_root(world: World) -> None:
    """D-1, T-8a, H-4, P-8, A-3: man, agent show, object which, reading tsh.config and policy
    query read only files every uid may read: each caller gets root's answer, exit 0, and
    nothing changes."""
    storage = world.storage
    agent_policy = storage / "agent" / "coder.d" / "policy"
    tool_policy = storage / "tool" / "fs.stat.d" / "policy"
    commands = [
        ("man", "agent"),
        ("agent", "show", "coder"),
        ("object", "which", "fs.stat"),
        ("tool", "tsh.config"),
        (
            "policy",
            "query",
            "--policy",
            agent_policy,
            "--policy",
            tool_policy,
            "coder_t",
            "tool:fs.stat",
            "execute",
        ),
    ]
    # Root's answers first: root's tsh.config call is a line of the tool's log, which the
    # others' calls are not, since they may not write it (docs/tools.md, "ctx tool").
    answers = [world.root_ok(*command).out for command in commands]
    assert answers[-1] == "allow\n"
    before = snapshot(storage)
    for command, expected in zip(commands, answers, strict=True):
        for user in world.people.others():
            got = world.as_(user, *command)
            assert (got.rc, got.out) == (0, expected), (user.name, got)
            assert TRACEBACK not in got.err, (user.name, got)
    assert snapshot(storage) == before


# ============================================================ the host administrator's alone


def test_creating_an_agent_is_refused_to_everyone_but_the_host_administrator(world: World):
    """A-3 and ``ctx agent create --help`` ("Only root or the owner of the storage root may
    create agents"): every other caller, naming itself as the agent's user or not, gets
    EACCES naming root and the root's owner; agent/ is unchanged."""
    storage = world.storage
    refusal = ADMIN_ONLY.format(uid=0, root=storage, action="create agents")
    request = json.dumps({"name": "intruder", "label": "intruder_t", "tools": ["fs.stat"]})
    before = snapshot(storage)
    for user in world.people.others():
        for options in ([], ["--user", user.name]):
            made = world.as_(user, "agent", "create", *options, "-", stdin=request)
            assert made.rc == 1, (user.name, made)
            assert f"ctx: EACCES: {refusal}" in made.err, (user.name, made)
            assert made.out == "", (user.name, made)
    assert not (storage / "agent" / "intruder").exists()
    assert snapshot(storage) == before


def test_running_a_tool_as_an_agent_is_refused_in_both_modes_and_records_nothing(world: World):
    """T-3, P-5 step 1, docs/tools.md "Running a tool" (stage caller): anyone but root and the
    root's owner is refused before anything is read — even the uid the agent runs as (the
    agent's uid for coder, the member for mine): exit 126 in terminal mode, one result frame
    (stage caller, step 1, no session) in native mode; no session, tool log or agent log
    changes."""
    storage = world.storage
    refusal = ADMIN_ONLY.format(uid=0, root=storage, action="run a tool as an agent")
    before = snapshot(storage)
    for user in world.people.others():
        for agent, extra in (("coder", []), ("mine", ["--project", SPACE])):
            terminal = world.as_(user, "run", "--agent", agent, *extra, "fs.stat", "/ctx")
            assert_refused(terminal, "EACCES", refusal, rc=126)
            native = world.as_(
                user,
                "run",
                "--agent",
                agent,
                *extra,
                "--native",
                "fs.stat",
                stdin='{"path": "/ctx"}',
            )
            assert native.rc == 1, (user.name, native)
            (result,) = frames(native.out)
            assert (result["type"], result["status"], result["session"]) == ("result", "error", "")
            assert (result["output"], result["exit_status"]) == (None, None), result
            error = result["error"]
            assert (error["error"], error["stage"], error["step"]) == ("EACCES", "caller", 1)
            assert error["message"].startswith(refusal), (user.name, error)
    assert snapshot(storage) == before


def test_a_worker_running_jobs_as_an_agent_is_refused_before_it_claims(world: World) -> None:
    """docs/workers.md "Who may start one": only root or the root's owner starts a worker
    with an agent; the member, who may work the queue, is refused for either agent (its own
    uid's included) with EACCES and claims nothing; the others cannot even open the queue.
    WAITING stays pending and nothing else changes."""
    storage, people = world.storage, world.people
    refusal = ADMIN_ONLY.format(
        uid=0, root=storage, action="start a worker that runs jobs' tools as an agent"
    )
    before = snapshot(storage)
    for user in people.others():
        for agent in ("coder", "mine"):
            worker = world.as_(
                user, "queue", "work", "--project", SPACE, "--agent", agent, "--drain"
            )
            if user is people.member:
                assert_refused(worker, "EACCES", refusal)
            else:
                assert_refused(worker, "EACCES", f"uid {user.uid} may not enter {world.space}")
    assert os.listdir(world.queue / "pending") == [WAITING]
    assert snapshot(storage) == before


def test_starting_a_terminal_is_refused_and_leaves_nothing_under_run(world: World) -> None:
    """A-1 and ``ctx agent start --help`` ("Needs root"): every other caller is refused with
    EACCES naming the host administrator, nothing is made under /run/cortexfs for this root,
    and a stop of a terminal that does not run is ENOENT, for them as for root."""
    storage = world.storage
    refusal = ADMIN_ONLY.format(uid=0, root=storage, action="start an agent")
    before = snapshot(storage)
    for user in world.people.others():
        started = world.as_(user, "agent", "start", "coder", "--session", "s1", "--no-workspace")
        assert_refused(started, "EACCES", refusal)
        stopped = world.as_(user, "agent", "stop", "coder", "--session", "s1")
        assert_refused(stopped, "ENOENT", "no terminal of coder in session s1 is running")
    assert not runtime_of(storage).exists()
    assert snapshot(storage) == before


def test_writes_to_the_roots_own_directories_are_refused_naming_the_directory(world: World):
    """R-5, X-1, T-8, H-4: bootstrap, a new space (``shared create`` or ``queue init``), an
    install into the system tier and a change of tsh's configuration are the root's owner's:
    every other caller gets EACCES naming the directory (or file), its owner and what to do,
    and nothing changes."""
    storage = world.storage
    manifest = world.manifest("extra")
    before = snapshot(storage)
    for user in world.people.others():
        boot = world.as_(user, "bootstrap")
        assert_refused(boot, "EACCES", f"uid {user.uid} may not write in {storage} (owner uid 0")
        for command in (("shared", "create", "newspace"), ("queue", "init", "-p", "newspace")):
            made = world.as_(user, *command)
            assert_refused(
                made,
                "EACCES",
                "cannot create shared space newspace",
                f"uid {user.uid} may not write in {storage}/shared (owner uid 0",
            )
        installed = world.as_(user, "object", "install", manifest, "--tier", "system")
        assert_refused(
            installed,
            "EACCES",
            "cannot install into tier system",
            f"may not write in {storage}/tool (owner uid 0",
        )
        configured = world.as_(user, "tool", "tsh.config", "cache_capacity=64")
        assert_refused(
            configured,
            "EACCES",
            f"cannot be changed by uid {user.uid}",
            "ctx tool tsh.config KEY=VALUE",
        )
    assert not (storage / "shared" / "newspace").exists()
    assert not (storage / "tool" / "extra").exists()
    assert snapshot(storage) == before


def test_a_link_of_ones_own_to_the_root_makes_nobody_its_administrator(world: World) -> None:
    """T-3, docs/tools.md ("root, or the owner of the storage root"): the member reaching
    root's root through a symbolic link the member owns is still not its owner: run, agent
    create and a worker as the member's own agent are refused, and nothing changes."""
    member, storage = world.people.member, world.storage
    link = world.home(member) / "my-root"
    world.sh_as(member, 'ln -s "$1" "$2"', storage, link)
    request = json.dumps({"name": "linked", "label": "linked_t", "tools": ["fs.stat"]})
    before = snapshot(storage)
    try:
        commands = [
            ("run", "--agent", "mine", "fs.stat", "/ctx"),
            ("agent", "create", "-"),
            ("queue", "work", "--project", SPACE, "--agent", "mine", "--drain"),
        ]
        for command in commands:
            done = world.as_(member, "--storage", link, *command, stdin=request)
            assert done.rc in (1, 126), done
            assert done.err.startswith(
                f"ctx: EACCES: only the host administrator (root, or uid 0 who owns {link})"
            ), done
    finally:
        link.unlink()
    assert snapshot(storage) == before


# ============================================================ the queue: Linux permissions decide


def test_non_members_are_refused_every_queue_command_naming_the_space_and_its_group(
    world: World,
) -> None:
    """X-1, Q-*, docs/queue.md ("A user who may write only part of a queue is refused with
    EACCES naming the directory that refused, its owner, group and mode, and what to do"):
    outsider, agent's uid and the user without a home here are refused every queue command,
    with nothing on stdout and nothing changed."""
    people, space = world.people, world.space
    commands = [
        ("publish", "-"),
        ("claim",),
        ("renew", WAITING),
        ("finish", WAITING, "--ok"),
        ("status",),
        ("show", WAITING),
        ("recover", "--reconcile"),
        ("init",),
    ]
    before = snapshot(world.storage)
    for user in people.non_members():
        for verb, *rest in commands:
            done = world.as_(user, "queue", verb, "--project", SPACE, *rest, stdin=REQUEST)
            assert_refused(
                done,
                "EACCES",
                f"uid {user.uid} may not enter {space} (owner uid 0, group {people.gid}, "
                "mode 3770)",
                f"as a member of group {people.gid}",
            )
    assert snapshot(world.storage) == before


def test_a_member_works_the_queue_from_publish_to_recover(fresh: World) -> None:
    """X-1, Q-1..Q-5, docs/queue.md: the member publishes (one and a batch), claims for a
    process of its own, renews, finishes, lists, shows and, once that process is gone,
    recovers the other claim; every entry made is the space's group's."""
    member, gid, queue = fresh.people.member, fresh.people.gid, fresh.queue

    def q(verb: str, *args: str, stdin: str = "") -> Run:
        done = fresh.as_(member, "queue", verb, "--project", SPACE, *args, stdin=stdin)
        assert done.rc == 0, done
        return done

    assert q("publish", "--name", "m1", "-", stdin=REQUEST).out == "m1.req.json\n"
    batch = q("publish", "--batch", "-", stdin=f"{REQUEST}\n{REQUEST}\n")
    assert len(batch.lines()) == 2, batch
    with process_of(member) as holder:
        first = q("claim", "--pid", str(holder.pid)).out.strip()
        assert first == WAITING  # the oldest pending job first
        q("renew", first, "--pid", str(holder.pid))
        q("finish", first, "--ok", "-", stdin='{"by": "member"}')
        second = q("claim", "--pid", str(holder.pid)).out.strip()
        assert second == "m1.req.json"
    status = json.loads(q("status", "--json").out)
    assert (status["pending"], status["claimed"], status["done"]) == (2, 1, 1), status
    recovered = fresh.as_(member, "queue", "recover", "--project", SPACE)
    assert recovered.rc == 0, recovered
    assert second in os.listdir(queue / "pending")
    assert "done" in q("show", first, "--json").out
    listed = q("list", "--state", "done").lines()
    assert listed == [first], listed
    result = json.loads((queue / "done" / f"{first}.result").read_text())
    assert result["output"] == {"by": "member"} and result["worker"]["pid"] == holder.pid
    for state in ("pending", "done"):
        for name in os.listdir(queue / state):
            assert owner_of(queue / state / name)[1] == gid, (state, name)


def test_only_the_holder_renews_a_lease_but_root_may_finish_it(fresh: World) -> None:
    """Q-3 ("no other process renews leases"), ``ctx queue renew --help`` ("EACCES when
    another process holds it"), Q-4 and docs/queue.md ("one member's claim may be recovered,
    or finished, by another"): a lease the member's process holds is not renewed by root's
    own process, which is refused naming the holder, the lease unchanged; the member renews
    it for that process; root then finishes the claim, whose result names that process."""
    member, queue = fresh.people.member, fresh.queue
    with process_of(member) as holder:
        claim = fresh.as_(member, "queue", "claim", "-p", SPACE, "--pid", str(holder.pid))
        assert claim.rc == 0 and claim.out == f"{WAITING}\n", claim
        lease = queue / "lease" / WAITING / "worker"
        before = lease.read_bytes()
        renewed = fresh.root("queue", "renew", "-p", SPACE, WAITING)
        assert_refused(
            renewed,
            "EACCES",
            f"job {WAITING} is leased to pid {holder.pid}",
            "only the holder renews its lease",
        )
        assert lease.read_bytes() == before
        own = fresh.as_(member, "queue", "renew", "-p", SPACE, WAITING, "--pid", str(holder.pid))
        assert own.rc == 0 and own.out.startswith(f"{WAITING} leased until "), own
        assert json.loads(lease.read_text())["pid"] == holder.pid
        finished = fresh.root(
            "queue",
            "finish",
            "-p",
            SPACE,
            WAITING,
            "--error",
            "-",
            stdin='{"why": "root stopped it"}',
        )
        assert finished.rc == 0, finished
    result = json.loads((queue / "failed" / f"{WAITING}.result").read_text())
    assert (result["status"], result["output"]) == ("error", {"why": "root stopped it"})
    assert result["worker"]["pid"] == holder.pid
    assert os.listdir(queue / "claimed") == [] and os.listdir(queue / "lease") == []


def test_a_members_worker_without_an_agent_fails_each_job_with_eacces(fresh: World) -> None:
    """W-1, ``ctx queue work --help`` (without --agent, "every job it claims is refused
    (EACCES) and finished in failed/ with the reason"): the member may run such a worker; it
    warns, fails WAITING at stage authorize and exits 0; no tool ran, no session was made."""
    member, queue = fresh.people.member, fresh.queue
    homes = sorted(os.listdir(fresh.storage / "home"))
    worker = fresh.as_(member, "queue", "work", "-p", SPACE, "--drain")
    assert worker.rc == 0, worker
    assert "ctx: warning: this worker was started without --agent" in worker.err, worker
    result = json.loads((queue / "failed" / f"{WAITING}.result").read_text())
    error = result["error"]
    assert (result["status"], error["error"], error["stage"]) == ("error", "EACCES", "authorize")
    assert "no agent identity" in error["message"], error
    assert owner_of(queue / "failed" / f"{WAITING}.result") == (member.uid, fresh.people.gid)
    assert sorted(os.listdir(fresh.storage / "home")) == homes


# ============================================================ sessions


def test_home_sessions_are_read_by_root_and_the_agents_uid_alone(world: World) -> None:
    """S-1, docs/sessions.md (a home session is "nobody else's to read"): the agent's uid lists,
    shows and tails coder's session as root does; every other caller is refused each session
    command with EACCES naming home/<uid>/agent, its owner and mode 0700; nothing changes."""
    people, storage = world.people, world.storage
    agent_dir = storage / "home" / str(people.agent.uid) / "agent"
    commands = [
        ("session", "list", "coder"),
        ("session", "show", "coder", "--json"),
        ("session", "tail", "coder", "-n", "1", "--json"),
    ]
    before = snapshot(storage)
    for command in commands:
        expected = world.root_ok(*command)
        got = world.as_(people.agent, *command)
        assert (got.rc, got.out) == (0, expected.out), got
    assert [e["type"] for e in frames(world.root_ok(*commands[1]).out)] == [
        "tool_call",
        "tool_result",
    ]
    refusal = (
        f"uid {{uid}} may not read {agent_dir} (owner uid {people.agent.uid}, "
        f"group {people.agent.gid}, mode 0700)"
    )
    for user in people.others():
        if user is people.agent:
            continue
        for command in (*commands, ("session", "repair", "coder")):
            done = world.as_(user, *command)
            assert_refused(done, "EACCES", refusal.format(uid=user.uid))
    assert snapshot(storage) == before


def test_the_agents_uid_repairs_a_torn_line_of_its_own_session(fresh: World) -> None:
    """S-5, ``ctx session repair --help``: the session is the agent's uid's file, which that
    uid may repair as root may: the torn line goes, the complete lines and the file's owner
    and mode stay."""
    agent = fresh.people.agent
    fresh.root_ok("run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/ctx"}')
    events = fresh.storage / "home" / str(agent.uid) / "agent" / "coder" / "session"
    events = events / "default" / "events.jsonl"
    whole = events.read_bytes()
    with events.open("ab") as torn:
        torn.write(b'{"ts": "2026-')
    repaired = fresh.as_(agent, "session", "repair", "coder", "--json")
    assert repaired.rc == 0, repaired
    assert repaired.json()["truncated_bytes"] == len(b'{"ts": "2026-'), repaired
    assert events.read_bytes() == whole
    assert owner_of(events) == (agent.uid, agent.gid) and mode(events) == 0o600


def test_shared_sessions_are_read_by_members_alone(world: World) -> None:
    """S-1, S-6, X-1: mine's session in the space is listed and shown to the member as to
    root; the outsider, the agent's uid and the user without a home here are refused with
    EACCES naming the space, its group and mode; nothing changes."""
    people, space = world.people, world.space
    commands = [
        ("session", "list", "mine", "--project", SPACE),
        ("session", "show", "mine", "--project", SPACE, "--json"),
        ("session", "tail", "mine", "--project", SPACE, "-n", "1"),
    ]
    before = snapshot(world.storage)
    for command in commands:
        expected = world.root_ok(*command)
        got = world.as_(people.member, *command)
        assert (got.rc, got.out) == (0, expected.out), got
    assert world.root_ok(*commands[0]).out == "default\n"
    for user in people.non_members():
        for command in commands:
            done = world.as_(user, *command)
            assert_refused(
                done,
                "EACCES",
                f"uid {user.uid} may not read {space} (owner uid 0, group {people.gid}, mode 3770)",
            )
    assert snapshot(world.storage) == before


def test_session_commands_for_a_uid_without_a_home_here(world: World) -> None:
    """R-4, S-1: for a uid that has no home under the root, the list of coder's sessions there
    is empty (exit 0) and a session shown is ENOENT naming it and the command that lists
    them; nothing is made."""
    owner, storage = world.people.owner, world.storage
    before = snapshot(storage)
    listed = world.as_(owner, "session", "list", "coder", "--uid", str(owner.uid))
    assert (listed.rc, listed.out) == (0, ""), listed
    shown = world.as_(owner, "session", "show", "coder", "--uid", str(owner.uid))
    assert_refused(
        shown,
        "ENOENT",
        f"there is no session home/{owner.uid}/agent/coder/session/default",
        f"'ctx session list coder --uid {owner.uid}'",
    )
    assert not (storage / "home" / str(owner.uid)).exists()
    assert snapshot(storage) == before


# ============================================================ tiers and spaces


def test_a_user_tier_without_a_home_is_refused_with_the_command_that_makes_one(fresh: World):
    """R-4, T-8 (``--tier user``: home/<uid>/tool/): a user without a home under root's root
    is refused with EACCES and the ``install -d`` an administrator runs; nothing is made.
    Once root runs exactly that command, the same install succeeds, as the user's own."""
    owner, storage = fresh.people.owner, fresh.storage
    manifest = fresh.manifest("mytool")
    before = snapshot(storage)
    refused = fresh.as_(owner, "object", "install", manifest, "--tier", "user")
    home = storage / "home" / str(owner.uid)
    command = f"install -d -o {owner.uid} -g {owner.gid} -m 0755 {home}"
    assert_refused(
        refused,
        "EACCES",
        "cannot install into tier user",
        f"uid {owner.uid} may not write in {storage}/home (owner uid 0",
        f"ask an administrator to create {home} owned by you ({command})",
    )
    assert snapshot(storage) == before
    subprocess.run(command.split(), check=True)
    installed = fresh.as_(owner, "object", "install", manifest, "--tier", "user")
    assert installed.rc == 0, installed
    assert owner_of(home / "tool" / "mytool")[0] == owner.uid
    listed = fresh.as_(owner, "object", "list", "--tier", "user")
    assert listed.rc == 0 and listed.out.split()[:2] == ["mytool", "user"], listed


def test_the_agents_uid_may_fill_its_own_tier_but_those_tools_run_for_nobody(fresh: World):
    """R-4, P-6, docs/policy.md (step 6: "a tool in the agent's own home … runs for nobody"):
    the agent's uid installs into its user tier (its home is its own), but even with both
    policies granting it, root's ``ctx run`` of that tool as coder is refused at step 6
    naming the file that is not host-owned; the tool never runs."""
    agent, storage = fresh.people.agent, fresh.storage
    # coder's first call makes its home, the agent's uid's (docs/sessions.md)
    fresh.root_ok("run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/ctx"}')
    installed = fresh.as_(agent, "object", "install", fresh.manifest("selfmade"), "--tier", "user")
    assert installed.rc == 0, installed
    tier = storage / "home" / str(agent.uid) / "tool"
    assert owner_of(tier / "selfmade")[0] == agent.uid
    with (storage / "agent" / "coder.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:selfmade execute\n")
    with (tier / "selfmade.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:selfmade execute\n")
    ran = fresh.root("run", "--agent", "coder", "selfmade")
    assert ran.rc == 126 and "ran" not in ran.out, ran
    assert ran.err.startswith("ctx: EACCES: step 6 (tool/model policy): "), ran
    assert "is not host-owned" in ran.err and f"belongs to uid {agent.uid}" in ran.err, ran


def test_a_member_may_complete_but_not_regroup_roots_space(world: World) -> None:
    """X-1, ``ctx shared create --help`` ("Root may regroup any entry, anyone else only their
    own: EPERM, nothing changed"): the member's create of the complete space, with or without
    its own group, and ``queue init`` have nothing to do; a regroup to the member's group is
    EPERM naming an entry of root's; nothing changes."""
    member, space = world.people.member, world.space
    before = snapshot(world.storage)
    for options in ([], ["--group", GROUP]):
        done = world.as_(member, "shared", "create", SPACE, *options)
        assert (done.rc, done.out) == (0, f"nothing to do: {space} is complete\n"), done
    init = world.as_(member, "queue", "init", "-p", SPACE)
    assert (init.rc, init.out) == (0, f"queue {world.queue} ready\n"), init
    regroup = world.as_(member, "shared", "create", SPACE, "--group", str(member.gid))
    assert_refused(
        regroup,
        "EPERM",
        "belongs to uid 0, so only root can change its group",
        "nothing was changed",
    )
    assert snapshot(world.storage) == before


def test_the_spaces_tier_is_installed_by_its_owner_alone(world: World) -> None:
    """X-1, docs/sessions.md ("tool/ is the owner's alone (02750) … only the space's owner
    installs them"): the member's install into shared:team is EACCES naming tool/ and its
    mode; the non-members cannot even reach it; nothing changes."""
    people, space = world.people, world.space
    manifest = world.manifest("planted")
    before = snapshot(world.storage)
    tier = f"shared:{SPACE}"
    by_member = world.as_(people.member, "object", "install", manifest, "--tier", tier)
    assert_refused(
        by_member,
        "EACCES",
        f"cannot install into tier {tier}",
        f"uid {people.member.uid} may not write in {space}/tool (owner uid 0, "
        f"group {people.gid}, mode 2750)",
    )
    for user in people.non_members():
        done = world.as_(user, "object", "install", manifest, "--tier", tier)
        assert_refused(done, "EACCES", f"uid {user.uid} may not enter {space}")
    assert not (space / "tool" / "planted").exists()
    assert snapshot(world.storage) == before


def test_non_members_neither_see_nor_change_the_space(world: World) -> None:
    """X-1, T-5, T-8a: to a non-member the space's tier is EACCES when named (object list
    --tier, shared create with or without --group), and a listing of every tier shows none
    of its tools; the member's listing shows them; nothing changes."""
    people, space = world.people, world.space
    before = snapshot(world.storage)
    member_list = world.as_(people.member, "object", "list")
    assert member_list.rc == 0 and "probe" in member_list.out, member_list
    for user in people.non_members():
        for command in (
            ("object", "list", "--tier", f"shared:{SPACE}"),
            ("shared", "create", SPACE),
            ("shared", "create", SPACE, "--group", GROUP),
        ):
            done = world.as_(user, *command)
            assert_refused(done, "EACCES", f"uid {user.uid} may not enter {space} (owner uid 0")
        listed = world.as_(user, "object", "list")
        assert listed.rc == 0 and "fs.stat" in listed.out, (user.name, listed)
        assert "probe" not in listed.out and f"shared:{SPACE}" not in listed.out, (
            user.name,
            listed,
        )
    assert snapshot(world.storage) == before


# ============================================================ policy explain by each caller


def test_a_member_explains_a_space_tool_as_root_does(world: World) -> None:
    """P-5, P-6, ``ctx policy explain --help``: the member, who may enter the space, gets
    root's six steps and root's verdict for mine's space tool."""
    command = ("policy", "explain", "mine", "tool:probe", "execute")
    expected = world.root_ok(*command)
    assert expected.out.endswith("\nallow\n"), expected
    got = world.as_(world.people.member, *command)
    assert (got.rc, got.out) == (0, expected.out), got


def _explains_or_says_who_may_not_read(world: World, *where: str) -> None:
    """Each non-member asking for mine's space tool gets root's answer, or an EACCES that
    names the caller's uid and the space it may not enter."""
    command = ("policy", "explain", "mine", "tool:probe", "execute", *where)
    expected = world.root_ok(*command)
    assert expected.out.endswith("\nallow\n"), expected
    for user in world.people.non_members():
        got = world.as_(user, *command)
        said = got.out + got.err
        same = (got.rc, got.out) == (0, expected.out)
        refused = (
            got.rc != 0
            and "EACCES" in said
            and f"uid {user.uid}" in said
            and str(world.space) in said
        )
        assert same or refused, (user.name, got)


def test_a_non_members_explain_of_a_space_tool_is_no_false_verdict(world: World) -> None:
    """P-5, docs/tools.md (CTX_PATH of an agent: a space's tool is "refused … rather than said
    not to exist"): the agent may run probe; whoever asks must not be told it does not
    exist."""
    _explains_or_says_who_may_not_read(world)


def test_a_non_members_explain_at_the_spaces_location_says_who_may_not_read(world: World):
    """P-5, ``ctx policy explain --help`` (step 2 judges the agent's bits, not the caller's):
    the caller's own refusal must be said as such."""
    _explains_or_says_who_may_not_read(world, "--location", f"shared/{SPACE}/tool")


# ============================================================ the storage owner


def test_the_storage_owner_administers_their_own_root(fresh_owner: World) -> None:
    """R-1, A-3, T-3, T-8, H-4, X-1, §2.4: on the root they bootstrapped, the owner creates an
    agent (running as them), runs its tool in both modes (recorded in their home, 0600),
    changes tsh's configuration, installs into the system tier, makes a space of their group
    and works its queue; everything made is theirs."""
    world, owner = fresh_owner, fresh_owner.people.owner
    root = world.owner_root

    def ok(*args: str | os.PathLike, stdin: str = "") -> Run:
        done = world.as_(owner, *args, stdin=stdin, storage=root)
        assert done.rc == 0, done
        return done

    request = json.dumps({"name": "second", "label": "second_t", "tools": ["fs.stat"]})
    made = ok("agent", "create", "--json", "-", stdin=request).json()
    assert (made["identity"]["uid"], made["identity"]["gid"]) == (owner.uid, owner.gid), made
    world.sh_as(
        owner,
        'echo "allow second_t tool:fs.stat execute" >> "$1"',
        root / "tool" / "fs.stat.d" / "policy",
    )
    assert "directory" in ok("run", "--agent", "second", "fs.stat", "/ctx").out
    native = ok("run", "--agent", "second", "--native", "fs.stat", stdin='{"path": "/ctx"}')
    result = frames(native.out)[-1]
    assert result["type"] == "result", native
    assert result["status"] == "ok" and result["output"]["uid"] == owner.uid, result
    events = root / "home" / str(owner.uid) / "agent" / "second" / "session" / "default"
    events = events / "events.jsonl"
    assert owner_of(events) == (owner.uid, owner.gid) and mode(events) == 0o600
    assert [e["type"] for e in read_jsonl(events)] == ["tool_call", "tool_result"] * 2
    assert "cache_capacity=48" in ok("tool", "tsh.config", "cache_capacity=48").out
    ok("object", "install", world.manifest("ownertool"), "--tier", "system")
    assert owner_of(root / "tool" / "ownertool")[0] == owner.uid
    ok("shared", "create", "mine")
    space = root / "shared" / "mine"
    assert owner_of(space) == (owner.uid, owner.gid) and mode(space) == 0o3770
    job = ok("queue", "publish", "-p", "mine", "-", stdin=REQUEST).out.strip()
    assert ok("queue", "claim", "-p", "mine", "--pid", "1").out.strip() == job
    ok("queue", "finish", "-p", "mine", job, "--ok")
    strangers = [path for path in root.rglob("*") if os.lstat(path).st_uid != owner.uid]
    assert strangers == []


def test_the_storage_owner_cannot_start_a_terminal_even_on_their_own_root(world: World):
    """A-1, README ("ctx agent start needs root"): the owner's start is EPERM naming root's
    command and ``ctx run`` instead; nothing under /run, nothing changed."""
    owner, root = world.people.owner, world.owner_root
    before = snapshot(root)
    started = world.as_(owner, "agent", "start", "own", "--no-workspace", storage=root)
    assert_refused(
        started,
        "EPERM",
        "an agent terminal is started by root",
        f"have root run 'ctx --storage {root} agent start own",
        "'ctx run --agent own TOOL'",
    )
    assert not runtime_of(root).exists()
    assert snapshot(root) == before


def test_others_are_refused_the_owners_administration(world: World) -> None:
    """T-3, A-3, R-5, H-4: on the owner's root the member, the outsider and the agent's uid
    are refused running the owner's agent, creating an agent, bootstrapping, installing into
    the system tier and changing tsh's configuration, each naming the owner's uid; nothing
    changes."""
    people, root = world.people, world.owner_root
    owner = people.owner.uid
    manifest = world.manifest("foreign")
    request = json.dumps({"name": "foreign", "label": "foreign_t", "tools": ["fs.stat"]})
    before = snapshot(root)
    for user in people.others():
        if user is people.owner:
            continue

        def on_root(*args: str | os.PathLike, stdin: str = "", user=user) -> Run:
            return world.as_(user, *args, stdin=stdin, storage=root)

        ran = on_root("run", "--agent", "own", "fs.stat", "/ctx")
        assert_refused(
            ran,
            "EACCES",
            ADMIN_ONLY.format(uid=owner, root=root, action="run a tool as an agent"),
            rc=126,
        )
        created = on_root("agent", "create", "-", stdin=request)
        assert_refused(
            created, "EACCES", ADMIN_ONLY.format(uid=owner, root=root, action="create agents")
        )
        boot = on_root("bootstrap")
        assert_refused(boot, "EACCES", f"may not write in {root} (owner uid {owner}")
        installed = on_root("object", "install", manifest, "--tier", "system")
        assert_refused(installed, "EACCES", f"may not write in {root}/tool (owner uid {owner}")
        configured = on_root("tool", "tsh.config", "window_percent=2")
        assert_refused(configured, "EACCES", f"cannot be changed by uid {user.uid}")
    assert snapshot(root) == before


def test_the_owner_gives_an_agent_only_their_own_identity(world: World) -> None:
    """A-3, ``ctx agent create --help`` ("Anyone but root can give an agent only their own uid
    and groups (EPERM otherwise)"): another user, another gid or another group is EPERM
    naming it; nothing is created."""
    people, root = world.people, world.owner_root
    owner = people.owner
    request = json.dumps({"name": "borrowed", "label": "borrowed_t", "tools": ["fs.stat"]})
    before = snapshot(root)
    for options, named in (
        (["--user", people.agent.name], f"runs as uid {people.agent.uid}"),
        (["--gid", str(people.gid)], f"runs as group {people.gid}"),
        (["--groups", f"{owner.gid},{people.gid}"], str(people.gid)),
    ):
        made = world.as_(owner, "agent", "create", *options, "-", stdin=request, storage=root)
        assert_refused(
            made,
            "EPERM",
            "only root can create an agent",
            named,
            f"you (uid {owner.uid}, groups {owner.gid}) can give an agent only "
            "your own uid and groups",
        )
    assert snapshot(root) == before


def test_the_owner_refused_an_agent_of_another_uid_is_told_of_the_uid(fresh_owner: World):
    """P-5 step 1, docs/tools.md ("A non-root host administrator can run agents whose identity
    is their own uid only"): root makes agent porter (the agent's uid) on the owner's root;
    the owner's call is refused, and the refusal says that uid is not theirs."""
    world, people = fresh_owner, fresh_owner.people
    request = json.dumps({"name": "porter", "label": "porter_t", "tools": ["fs.stat"]})
    world.root_ok(
        "agent", "create", "--user", people.agent.name, "-", stdin=request, storage=world.owner_root
    )
    ran = world.as_(
        people.owner, "run", "--agent", "porter", "fs.stat", "/ctx", storage=world.owner_root
    )
    assert ran.rc == 126 and ran.err.startswith("ctx: EACCES: "), ran
    assert f"uid {people.agent.uid}" in ran.err, ran


def test_the_owners_refused_call_of_another_uids_agent_leaves_no_home(fresh_owner: World):
    """P-5 step 1, S-1, docs/sessions.md (home directories belong to "the agent's uid and
    gid"): root makes agent porter (the agent's uid, with the owner's group among its groups)
    on the owner's root; the owner's call is refused at step 1 and leaves no home of the
    agent's uid that is not the agent's."""
    world, people = fresh_owner, fresh_owner.people
    root = world.owner_root
    request = json.dumps({"name": "porter", "label": "porter_t", "tools": ["fs.stat"]})
    groups = f"{people.agent.gid},{people.owner.gid}"
    world.root_ok(
        "agent",
        "create",
        "--user",
        people.agent.name,
        "--groups",
        groups,
        "-",
        stdin=request,
        storage=root,
    )
    ran = world.as_(people.owner, "run", "--agent", "porter", "fs.stat", "/ctx", storage=root)
    assert_refused(ran, "EACCES", "step 1 (peer credentials)", rc=126)
    home = root / "home" / str(people.agent.uid)
    assert not home.exists() or owner_of(home)[0] == people.agent.uid, sorted(
        f"{p} uid {os.lstat(p).st_uid}" for p in [home, *home.rglob("*")]
    )


def _owner_without_home(world: World) -> tuple[Path, str]:
    """The owner's root with its home/ given to root and the owner's home removed (a root
    another administrator laid out); a job pending in the owner's space ``q``."""
    root, owner = world.owner_root, world.people.owner
    made = world.as_(owner, "queue", "init", "-p", "q", storage=root)
    assert made.rc == 0, made
    job = world.as_(owner, "queue", "publish", "-p", "q", "-", stdin=REQUEST, storage=root)
    assert job.rc == 0, job
    shutil.rmtree(root / "home" / str(owner.uid))
    os.chown(root / "home", 0, 0)
    return root, job.out.strip()


def test_an_owner_without_a_home_is_told_which_directory_refused_and_what_to_do(
    fresh_owner: World,
) -> None:
    """S-1, README ("Errors read ctx: ERRNO: what to do"): the owner's ``ctx run`` cannot make
    its session; the refusal names home/ and its owner, or the home to create for the owner;
    nothing is made."""
    world, owner = fresh_owner, fresh_owner.people.owner
    root, _ = _owner_without_home(world)
    before = snapshot(root)
    ran = world.as_(owner, "run", "--agent", "own", "fs.stat", "/ctx", storage=root)
    assert ran.rc == 126 and ran.err.startswith("ctx: EACCES: "), ran
    assert snapshot(root) == before
    assert f"{root}/home (owner uid 0" in ran.err or f"owned by uid {owner.uid}" in ran.err, ran


def test_an_owners_worker_without_a_home_names_it_and_claims_nothing(fresh_owner: World):
    """docs/workers.md ("a storage owner under a root-owned home/: EACCES … naming the session,
    the home ROOT/home/<uid> and what to do"): the worker claims nothing and says how to go
    on; the job stays pending and nothing changes."""
    world, owner = fresh_owner, fresh_owner.people.owner
    root, job = _owner_without_home(world)
    before = snapshot(root)
    worker = world.as_(owner, "queue", "work", "-p", "q", "--agent", "own", "--drain", storage=root)
    home = root / "home" / str(owner.uid)
    assert_refused(
        worker, "EACCES", "no job was claimed", f"create {home} owned by uid {owner.uid} first"
    )
    assert os.listdir(root / "shared" / "q" / "queue" / "pending") == [job]
    assert snapshot(root) == before


# ============================================================ terminals


CLIENT = r"""
import socket, sys, time
path, mode = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
try:
    s.sendall(mode.encode() + b"\n")
except OSError:
    pass
s.settimeout(0.2)
data, deadline = b"", time.monotonic() + 10
while time.monotonic() < deadline and b"$ " not in data:
    try:
        chunk = s.recv(65536)
    except socket.timeout:
        continue
    except OSError:
        break
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode("utf-8", "replace"))
"""


def raw_client(user: UnprivilegedUser, socket_path: str, mode_line: str) -> str:
    """What a client of its own, run as ``user``, reads from the terminal socket after its mode
    line: up to tsh's prompt, or until the terminal closes the connection."""
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, socket_path, mode_line],
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done
    return done.stdout


@contextlib.contextmanager
def terminal(world: World, agent: str, storage: Path) -> Iterator[dict]:
    """Root's ``ctx agent start AGENT`` on ``storage``; stopped by root on the way out."""
    session = "who"
    started = world.root(
        "agent", "start", agent, "--session", session, "--no-workspace", "--json", storage=storage
    )
    assert started.rc == 0, started
    try:
        yield started.json()
    finally:
        world.root("agent", "stop", agent, "--session", session, storage=storage)


def running(world: World, agent: str, storage: Path) -> list[dict]:
    return world.root_ok("agent", "show", agent, "--json", storage=storage).json()["terminals"]


@needs_fuse_as_root
@needs_terminals
def test_who_may_watch_attach_and_stop_roots_terminal(fresh: World) -> None:
    """A-2, docs/tools.md ("root and the owner of the storage root may watch and attach, the
    agent's own uid may watch; anyone else is refused with EACCES … by ctx agent
    watch|attach before it connects"; a stop of one another user started is EPERM): the
    agent's uid watches (tsh's prompt) but may not attach; the member and the outsider may
    do neither; none of them stops it, and it goes on running until root stops it."""
    people, storage = fresh.people, fresh.storage
    with terminal(fresh, "coder", storage):
        session = ("--session", "who")
        log = fresh.top / "watch.out"
        with open(log, "w") as out:
            watcher = subprocess.Popen(
                [*CTX_ARGV, "agent", "watch", "coder", *session],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                user=people.agent.uid,
                group=people.agent.gid,
                extra_groups=people.agent.groups,
                env=clean_env(CTX_STORAGE=str(storage)),
            )
        try:
            assert wait_for(lambda: "coder$ " in log.read_text(), 20), log.read_text()
            watcher.send_signal(signal.SIGINT)
            assert watcher.wait(timeout=20) == 0, log.read_text()
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
        attach = fresh.as_(people.agent, "agent", "attach", "coder", *session, stdin="fs.stat /\n")
        assert_refused(
            attach,
            "EACCES",
            f"uid {people.agent.uid} may not attach to agent coder's terminal",
            f"only root and the owner of {storage} may (watch it instead)",
        )
        for user in (people.member, people.outsider):
            watch = fresh.as_(user, "agent", "watch", "coder", *session)
            assert_refused(
                watch,
                "EACCES",
                f"uid {user.uid} may not watch agent coder's terminal: only root, "
                f"the owner of {storage} and the agent's uid {people.agent.uid} may",
            )
            attach = fresh.as_(user, "agent", "attach", "coder", *session)
            assert_refused(
                attach,
                "EACCES",
                f"uid {user.uid} may not attach to agent coder's terminal: only "
                f"root and the owner of {storage} may",
            )
        for user in (people.agent, people.member):
            stop = fresh.as_(user, "agent", "stop", "coder", *session)
            assert_refused(
                stop,
                "EPERM",
                "the terminal of coder runs as root, who started it",
                "stop it as root",
            )
        assert [t["session"] for t in running(fresh, "coder", storage)] == ["who"]
        events = storage / "home" / str(people.agent.uid) / "agent" / "coder" / "session"
        assert read_jsonl(events / "who" / "events.jsonl") == []  # nobody typed anything
    assert running(fresh, "coder", storage) == []
    assert not runtime_of(storage).exists()


@needs_fuse_as_root
@needs_terminals
def test_the_terminal_itself_refuses_a_client_that_skips_ctxs_check(fresh: World) -> None:
    """A-2, docs/tools.md ("and by the terminal itself (ctxterm: EACCES: …) for a client that
    skips that check"): connecting to the socket directly, the member is refused even a
    watch and the agent's uid an attach, each with one ctxterm line; the agent's uid's
    watch gets tsh's prompt."""
    people = fresh.people
    with terminal(fresh, "coder", fresh.storage) as facts:
        where = facts["listening_at"]
        for mode_line in ("watch", "attach"):
            said = raw_client(people.member, where, mode_line)
            assert said.startswith(
                f"ctxterm: EACCES: uid {people.member.uid} may not watch agent coder's terminal"
            ), said
            assert "coder$" not in said, said
        attached = raw_client(people.agent, where, "attach")
        assert attached.startswith(
            f"ctxterm: EACCES: uid {people.agent.uid} may not attach to agent coder's terminal"
        ), attached
        assert raw_client(people.agent, where, "watch").endswith("coder$ ")


@needs_fuse_as_root
@needs_terminals
def test_the_storage_owner_attaches_to_a_terminal_root_started_on_their_root(
    fresh_owner: World,
) -> None:
    """A-2, docs/tools.md: on the owner's root, root makes agent porter (the agent's uid) and
    starts its terminal; the owner attaches and types into it, but a stop of root's terminal
    is EPERM; the member may not watch it."""
    world, people = fresh_owner, fresh_owner.people
    root = world.owner_root
    request = json.dumps({"name": "porter", "label": "porter_t", "tools": ["fs.stat"]})
    world.root_ok("agent", "create", "--user", people.agent.name, "-", stdin=request, storage=root)
    with terminal(world, "porter", root):
        session = ("--session", "who")
        attach = world.as_(
            people.owner, "agent", "attach", "porter", *session, stdin="nosuchtool\n", storage=root
        )
        assert attach.rc == 0, attach
        assert "porter$ nosuchtool" in attach.out, attach  # typed into tsh, which answers
        assert "tsh: nosuchtool: not a tool on CTX_PATH" in attach.out, attach
        stop = world.as_(people.owner, "agent", "stop", "porter", *session, storage=root)
        assert_refused(stop, "EPERM", "the terminal of porter runs as root, who started it")
        watch = world.as_(people.member, "agent", "watch", "porter", *session, storage=root)
        assert_refused(
            watch, "EACCES", f"uid {people.member.uid} may not watch", f"the owner of {root}"
        )
        assert [t["session"] for t in running(world, "porter", root)] == ["who"]
    assert running(world, "porter", root) == []


# ============================================================ mounts


@needs_fuse_as_root
def test_only_the_uid_that_mounted_unmounts_and_the_mount_makes_no_one_administrator(
    world: World,
) -> None:
    """F-1, docs/mount.md ("another uid's mount EPERM (only the uid that mounted it, or root,
    may unmount it)"): root's mount of its root stays mounted when the member or the outsider
    unmounts it; their ``ctx umount`` without a mount point finds none of theirs (ENOENT);
    through the mount the member is still refused what only the administrator may do."""
    people = world.people
    where = world.top / "ctx-view"
    where.mkdir(mode=0o755)
    try:
        with serving(world.storage, where):
            for user in (people.member, people.outsider):
                done = world.as_(user, "umount", where)
                assert_refused(
                    done,
                    "EPERM",
                    f"cannot unmount {where}",
                    "it was mounted by uid 0, and only that uid or root may unmount it",
                )
                assert mounted_at(where)
                anyone = world.as_(user, "umount")
                assert_refused(anyone, "ENOENT", "no storage root is mounted with 'ctx mount'")
            through = world.as_(
                people.member, "run", "--agent", "mine", "fs.stat", "/ctx", storage=where
            )
            assert_refused(
                through,
                "EACCES",
                ADMIN_ONLY.format(uid=0, root=where, action="run a tool as an agent"),
                rc=126,
            )
            assert mounted_at(where)
    finally:
        where.rmdir()


# ============================================================ the matrix's corners


def test_root_may_do_what_it_refuses_the_others(world: World) -> None:
    """The other side of the refusals above: root, in no group of the space and not the
    agent's uid, lists coder's home sessions, reads the space's queue and tier and explains
    coder's grant, each exit 0, changing nothing."""
    before = snapshot(world.storage)
    assert world.root_ok("session", "list", "coder").out == "default\n"
    status = json.loads(world.root_ok("queue", "status", "-p", SPACE, "--json").out)
    assert (status["pending"], status["claimed"]) == (1, 0), status
    assert world.root_ok("object", "list", "--tier", f"shared:{SPACE}").out.startswith("probe ")
    explained = world.root_ok("policy", "explain", "coder", "tool:fs.stat", "execute")
    assert explained.out.endswith("\nallow\n"), explained
    assert snapshot(world.storage) == before


def test_a_members_queue_init_never_replaces_roots_queue_config(world: World) -> None:
    """X-1, docs/queue.md (the queue's ``config`` stays the owner's): the member, who works
    the queue, cannot rewrite its config (0644, root's), so a member's ``queue init`` never
    replaces it; the file is unchanged."""
    member, queue = world.people.member, world.queue
    config = queue / "config"
    assert owner_of(config)[0] == 0 and mode(config) == 0o644
    before = config.read_bytes()
    done = subprocess.run(
        ["/bin/sh", "-c", 'echo "lease_ttl=1" >> "$1"', "sh", str(config)],
        user=member.uid,
        group=member.gid,
        extra_groups=member.groups,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "Permission denied" in done.stderr, done
    again = world.as_(member, "queue", "init", "-p", SPACE)
    assert again.rc == 0, again
    assert config.read_bytes() == before
