"""CortexFS commands run as uid 0 whose capability set is smaller than a full root's, as in a
container or a hardened service (SPEC R-2, R-5, X-1, A-1, A-2, A-3, P-5 step 1, T-3, T-6, §2,
Q-4, Q-5, W-1 … W-4, S-5, F-1).  Each command runs under ``setpriv --bounding-set -CAP,…
--inh-caps -all --ambient-caps -all`` (and ``--no-new-privs`` where said): uid 0 at exec then
holds exactly the bounding set.  The sets are Docker's default one (no ``CAP_SYS_ADMIN``,
``CAP_NET_ADMIN``, ``CAP_SYS_PTRACE`` …) and the drops of hardened units (``CAP_CHOWN``,
``CAP_DAC_OVERRIDE``, ``CAP_FOWNER``, ``CAP_FSETID``, ``CAP_SETUID``/``CAP_SETGID``,
``CAP_KILL``).  A command either does what a full root does, with the same owners and modes,
or refuses with ``ctx: ERRNO: …`` saying what is missing, leaves the tree as it was, runs no
tool, and loses or repeats no job."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    kill_processes_of,
    mounted_at,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    serving,
    wait_for,
)
from tests.acceptance.workercli import AGENT, LABEL, allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import copy_of_root
from tests.support.users import access_as, members_of, run_as

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
RUNTIME = Path("/run/cortexfs/terminal")
GROUP, MEMBER = "ctxcap-g", "ctxcap-m"
SPACE = "grp"
# capabilities(7): the bit of each capability this file takes away.
CAP_BITS = {
    "chown": 0,
    "dac_override": 1,
    "dac_read_search": 2,
    "fowner": 3,
    "fsetid": 4,
    "kill": 5,
    "setgid": 6,
    "setuid": 7,
    "net_admin": 12,
    "sys_admin": 21,
}
# What a hardened unit typically takes away (CapabilityBoundingSet=~…).
HARDENED = ("chown", "dac_override", "fowner", "setuid", "setgid", "kill")
# Docker's default set: everything else is gone, CAP_SYS_ADMIN and CAP_NET_ADMIN included.
DOCKER_SET = (
    "-all,+chown,+dac_override,+fsetid,+fowner,+mknod,+net_raw,+setgid,+setuid,+setfcap,"
    "+setpcap,+net_bind_service,+sys_chroot,+kill,+audit_write"
)
NO_DAC = ("dac_override", "dac_read_search", "fowner")
NOBODY = pwd.getpwnam("nobody")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv(1) to run ctx as uid 0 with fewer capabilities",
)


# ------------------------------------------------------------------------------ helpers


def _caps_of(status: str, field: str) -> int:
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in {status!r}")


@pytest.fixture(scope="module", autouse=True)
def droppable() -> None:
    """Skip unless this process holds every capability of :data:`CAP_BITS` (the full root the
    reduced runs are compared with) and setpriv can take them all away from a child."""
    own = _caps_of(Path("/proc/self/status").read_text(), "CapEff")
    missing = [name for name, bit in CAP_BITS.items() if not own >> bit & 1]
    if missing:
        pytest.skip(f"this root already lacks {', '.join(missing)}: no full root to compare")
    probe = subprocess.run(
        [*prefix(tuple(CAP_BITS), nnp=True), "cat", "/proc/self/status"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop capabilities here: {probe.stderr.strip()}")
    left = _caps_of(probe.stdout, "CapEff") | _caps_of(probe.stdout, "CapBnd")
    kept = [name for name, bit in CAP_BITS.items() if left >> bit & 1]
    if kept or _caps_of(probe.stdout, "NoNewPrivs") != 1:
        pytest.skip(f"setpriv could not take away {kept} (or set no_new_privs)")


def prefix(drop: Sequence[str] | str, *, nnp: bool = False) -> list[str]:
    """setpriv's argv to exec uid 0 without the capabilities ``drop`` (names, or a whole
    ``--bounding-set`` value), none inheritable or ambient."""
    bounding = drop if isinstance(drop, str) else ",".join(f"-{name}" for name in drop)
    argv = ["setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--ambient-caps", "-all"]
    return [*argv, "--no-new-privs"] if nnp else argv


def ctx_without(
    drop: Sequence[str] | str,
    *args: str | os.PathLike,
    env: dict[str, str],
    input: str = "",
    cwd: Path | None = None,
    nnp: bool = False,
) -> Run:
    """``ctx ARGS`` as uid 0 without ``drop``."""
    argv = [*prefix(drop, nnp=nnp), *CTX_ARGV, *map(str, args)]
    done = subprocess.run(
        argv, input=input.encode(), capture_output=True, env=env, cwd=cwd, timeout=60
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def refused(run: Run, code: str, rc: int = 1) -> None:
    """``run`` ended with ``ctx: CODE: …`` as its last line of stderr, exit ``rc``."""
    assert TRACEBACK not in run.err, run
    lines = run.err.splitlines()
    assert run.rc == rc and lines and lines[-1].startswith(f"ctx: {code}: "), run


def tree(top: Path, *, content: bool = True) -> dict[str, tuple]:
    """Every entry at and under ``top`` (no link followed): type, mode, owner, group, and the
    bytes of a file or the target of a link when ``content``."""
    found: dict[str, tuple] = {}
    paths = [top]
    for dirpath, dirnames, filenames in os.walk(top):
        paths += [Path(dirpath, name) for name in dirnames + filenames]
    for path in paths:
        st = path.lstat()
        extra = None
        if content and stat.S_ISREG(st.st_mode):
            extra = path.read_bytes()
        elif content and stat.S_ISLNK(st.st_mode):
            extra = os.readlink(path)
        key = str(path.relative_to(top))
        found[key] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        found[key] += (extra,)
    return found


def names_what_is_missing(message: str) -> bool:
    """A refusal for a missing capability says so, and does not send uid 0 to root."""
    said = re.search(r"CAP_[A-Z_]+|capabilit", message) is not None
    return said and not re.search(r"\bas root\b", message)


def root_key(root: Path) -> str:
    """docs/tools.md: the first 16 hex digits of the SHA-256 of the root's real path."""
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]


class World:
    """A bootstrapped root (queue ``proj``) in a scratch directory every uid may search, agent
    ``ci`` (uid nobody) allowed ``shell.exec`` by both policies, and a directory its tools
    may write."""

    def __init__(self, template: Path, top: Path, out: Path, *, agent: bool = True) -> None:
        self.top = top
        self.storage = copy_of_root(template, top / "storage")
        self.out = out
        cache = top / "cache"
        cache.mkdir()
        self.env = clean_env(CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(cache))
        self.queue = QueueCLI(self.storage, "proj")
        if agent:
            make_agent(self.storage, ["shell.exec"])
            allow_in_tool_policy(self.storage, "shell.exec")

    def ctx(self, *args: str | os.PathLike, input: str = "") -> Run:
        return ctx_run(*args, input=input, env=self.env)

    def without(self, drop: Sequence[str] | str, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_without(drop, *args, **kw)

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(NOBODY.pw_uid)

    def events(self, session: str = "default") -> list[dict]:
        path = self.home / "agent" / AGENT / "session" / session / "events.jsonl"
        return read_jsonl(path)

    def publish(self, *cmds: str) -> list[str]:
        return [self.queue.publish(shell_job(cmd)) for cmd in cmds]


@pytest.fixture
def scratch() -> Iterator[Path]:
    where = new_scratch_dir(SCRATCH)
    try:
        yield where
    finally:
        kill_processes_of(where)
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def world(_template: Path, scratch: Path, outbox: Path) -> World:
    return World(_template, scratch, outbox)


@pytest.fixture
def bare_world(_template: Path, scratch: Path, outbox: Path) -> World:
    """A :class:`World` without the agent, for what runs no tool."""
    return World(_template, scratch, outbox, agent=False)


@pytest.fixture
def member():
    """The second real user, a member of a group root is not in; the user and the gid."""
    (user,), gid = members_of(GROUP, MEMBER)
    return user, gid


@pytest.fixture
def group_space(bare_world: World, member) -> tuple[World, QueueCLI]:
    """Space ``grp`` made by a full root with ``--group``: its queue is group-owned (X-1)."""
    world = bare_world
    made = world.ctx("shared", "create", SPACE, "--group", GROUP)
    assert made.rc == 0, made
    return world, QueueCLI(world.storage, SPACE)


def as_member(user, world: World, *args: str, input: str | None = None):
    """``ctx ARGS`` as the member, with its groups, on the world's root."""
    cache = world.top / "member-cache"
    if not cache.exists():
        cache.mkdir()
        os.chown(cache, user.uid, user.gid)
    env = {**world.env, "XDG_CACHE_HOME": str(cache)}
    return run_as(user, [*CTX_ARGV, *args], user.groups, env=env, stdin=input)


def abandoned_claim(world: World, queue: QueueCLI, user) -> str:
    """A job the member published and claimed for a process of theirs that has exited."""
    job = json.dumps(shell_job(f"touch {world.out}/abandoned"))
    published = as_member(user, world, "queue", "publish", "--project", SPACE, "-", input=job)
    assert published.returncode == 0, published
    gone = subprocess.Popen(["true"], user=user.uid, group=user.gid)
    gone.wait()
    claimed = as_member(user, world, "queue", "claim", "--project", SPACE, "--pid", str(gone.pid))
    assert claimed.returncode == 0, claimed
    return claimed.stdout.strip()


def terminal_dirs(world: World, agent: str, session: str) -> list[Path]:
    """What a terminal of ``agent`` in ``session`` has, or left, under /run and in its
    session: its runtime directory, the alias's, the session's link."""
    uid = str(NOBODY.pw_uid)
    found = [
        RUNTIME / root_key(world.storage) / uid / agent / session,
        RUNTIME / uid / agent / session,
        world.home / "agent" / agent / "session" / session / "terminal",
    ]
    return [path for path in found if os.path.lexists(path)]


@contextlib.contextmanager
def terminals_stopped(world: World, agent: str) -> Iterator[list[str]]:
    """Sessions the block starts terminals of (appended to the list), each stopped by a full
    root afterwards, whatever the block did."""
    sessions: list[str] = []
    try:
        yield sessions
    finally:
        for session in sessions:
            world.ctx("agent", "stop", agent, "--session", session)
            view = RUNTIME / root_key(world.storage) / str(NOBODY.pw_uid) / agent / session
            if mounted_at(view / "private" / "ctx"):
                subprocess.run(["umount", "-l", str(view / "private" / "ctx")], check=False)
        kill_processes_of(world.storage)


def new_session() -> str:
    return f"cap{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------------ bootstrap


def test_bootstrap_under_a_hardened_set_makes_what_a_full_root_makes(
    _template: Path, scratch: Path
) -> None:
    """R-2, R-5: ``ctx bootstrap`` of a new root as uid 0 without CAP_CHOWN, CAP_DAC_OVERRIDE,
    CAP_FOWNER, CAP_SETUID, CAP_SETGID and CAP_KILL, under no_new_privs, exits 0 and makes
    exactly the entries, modes and owners a full root's bootstrap makes."""
    reduced = scratch / "reduced"
    made = ctx_without(HARDENED, "bootstrap", "--storage", reduced, env=clean_env(), nnp=True)
    assert made.rc == 0 and TRACEBACK not in made.err, made
    full = tree(_template, content=False)  # a full root's bootstrap (and its queue proj)
    full = {k: v for k, v in full.items() if not k.startswith(f"shared{os.sep}proj")}
    assert tree(reduced, content=False) == full


def test_bootstrap_without_cap_chown_of_a_root_another_uid_owns_makes_nothing(
    scratch: Path, member
) -> None:
    """R-5 (idempotent, creates or repairs), R-2: root bootstrapping a root that another uid
    owns gives the six entries to that owner; without CAP_CHOWN it cannot, and must say so
    (EPERM) with the root as it was, so that a later run makes them as a full root would."""
    user, _ = member
    root = scratch / "owned"
    root.mkdir()
    os.chown(root, user.uid, user.gid)
    before = tree(root)
    run = ctx_without(("chown",), "bootstrap", "--storage", root, env=clean_env())
    refused(run, "EPERM")
    assert tree(root) == before


def bootstrap_without_dac_override(scratch: Path, user) -> tuple[Run, Path, dict]:
    root = scratch / "owned"
    root.mkdir()
    os.chown(root, user.uid, user.gid)
    before = tree(root)
    return ctx_without(NO_DAC, "bootstrap", "--storage", root, env=clean_env()), root, before


def test_bootstrap_without_dac_override_of_a_root_another_uid_owns_changes_nothing(
    scratch: Path, member
) -> None:
    """R-5: without CAP_DAC_OVERRIDE, uid 0 may not write in a root another uid owns (0755):
    EACCES, exit 1, and nothing is made in it."""
    run, root, before = bootstrap_without_dac_override(scratch, member[0])
    refused(run, "EACCES")
    assert tree(root) == before


# ------------------------------------------------------------------------------ shared spaces


def test_shared_create_under_dockers_default_set_makes_the_space_a_full_root_makes(
    bare_world: World, member, scratch: Path
) -> None:
    """X-1: ``ctx shared create NAME --group G`` as uid 0 with Docker's default capabilities
    and no_new_privs makes the space with the group, the setgid and sticky bits and the
    modes that a full root's run gives another root."""
    world = bare_world
    other = copy_of_root(world.storage, scratch / "other")
    full = ctx_run("shared", "create", SPACE, "--group", GROUP, "--storage", other)
    assert full.rc == 0, full
    run = world.without(DOCKER_SET, "shared", "create", SPACE, "--group", GROUP, nnp=True)
    assert run.rc == 0 and TRACEBACK not in run.err, run
    space = tree(world.storage / "shared" / SPACE)
    assert space == tree(other / "shared" / SPACE)
    assert {entry[3] for entry in space.values()} == {member[1]}


def test_shared_create_without_cap_chown_leaves_no_half_made_space(
    bare_world: World, member
) -> None:
    """X-1, CONVENTIONS (errors with an errno and what to do): without CAP_CHOWN root cannot
    give the space a group it is not in: EPERM, exit 1, and shared/ as it was."""
    world = bare_world
    before = tree(world.storage / "shared")
    run = world.without(("chown",), "shared", "create", SPACE, "--group", GROUP)
    refused(run, "EPERM")
    assert tree(world.storage / "shared") == before


def test_shared_create_without_cap_fsetid_never_reports_a_space_it_did_not_make(
    bare_world: World, member
) -> None:
    """X-1 and ``ctx shared create --help`` ("Its directories belong to the group and are
    setgid"): uid 0 without CAP_FSETID, not in the group, cannot set S_ISGID (chmod(2)); the
    command either makes every directory of the space setgid or refuses with an errno."""
    world = bare_world
    run = world.without(("fsetid",), "shared", "create", SPACE, "--group", GROUP)
    assert TRACEBACK not in run.err, run
    space = world.storage / "shared" / SPACE
    if run.rc != 0:
        refused(run, "EPERM")
        return
    directories = [p for p in (space, *space.rglob("*")) if p.is_dir()]
    assert directories and all(p.stat().st_mode & stat.S_ISGID for p in directories), run


def test_shared_create_without_cap_fowner_names_the_session_and_changes_nothing(
    group_space, member
) -> None:
    """X-1, ``ctx shared create --help`` (a directory it may not repair is refused, EPERM,
    naming it, nothing changed): a space whose data/ (2775) and whose agent session
    directories (the agent's, 2770, as an older version made them) need repair, run by uid 0
    without CAP_FOWNER, which may not chmod the agent's directories: refused naming the
    directory or the capability."""
    world, _ = group_space
    user, gid = member
    space = world.storage / "shared" / SPACE
    (space / "data").chmod(0o2775)
    session = space / "agent" / "coder" / "session" / "default"
    session.mkdir(parents=True)
    for path in (session, session.parent, session.parent.parent):
        os.chown(path, user.uid, gid)
        path.chmod(0o2770)
    before = tree(space)
    run = world.without(("fowner",), "shared", "create", SPACE, "--group", GROUP)
    refused(run, "EPERM")
    assert str(space / "agent" / "coder") in run.err or "CAP_FOWNER" in run.err, run
    assert tree(space) == before


# ------------------------------------------------------------------------------ agents, tools


def test_agent_create_under_a_hardened_set_writes_the_controls_a_full_root_writes(
    world: World, scratch: Path
) -> None:
    """A-3: ``ctx agent create`` as uid 0 without CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER,
    CAP_SETUID, CAP_SETGID, CAP_KILL, under no_new_privs, makes ``agent/NAME`` and the same
    ``agent/NAME.d`` controls (names, modes, owners, policy) as a full root, and no new root
    entry."""
    other = copy_of_root(world.storage, scratch / "other")
    req = json.dumps({"name": "coder", "label": "coder_t", "tools": ["fs.stat"]})
    full = ctx_run("agent", "create", "--storage", other, "-", input=req)
    assert full.rc == 0, full
    run = world.without(HARDENED, "agent", "create", "-", input=req, nnp=True)
    assert run.rc == 0 and TRACEBACK not in run.err, run
    mine, theirs = world.storage / "agent", other / "agent"
    assert tree(mine / "coder.d", content=False) == tree(theirs / "coder.d", content=False)
    assert tree(mine / "coder", content=False) == tree(theirs / "coder", content=False)
    policy = "coder.d/policy"
    assert (mine / policy).read_text() == (theirs / policy).read_text()
    assert sorted(os.listdir(world.storage)) == sorted(os.listdir(other))


def test_run_without_cap_setuid_is_refused_with_eperm_before_the_tool(world: World) -> None:
    """P-5 step 1, T-3, T-7: uid 0 that cannot switch to the agent's uid must not run the tool
    (nor as root): refused like any call the host cannot start, exit 126 with
    ``ctx: EPERM: …``, and the call recorded with that errno, not as the tool's exit."""
    marker = world.out / "ran"
    run = world.without(
        ("setuid", "setgid"), "run", "--agent", AGENT, "shell.exec",
        input=json.dumps({"cmd": f"touch {marker}"}),
    )  # fmt: skip
    assert not marker.exists()
    refused(run, "EPERM", rc=126)
    last = world.events()[-1]
    assert (last["type"], last["errno"], last["exit_status"]) == ("tool_result", "EPERM", None)


def test_native_run_without_cap_setgid_reports_eperm_not_an_exit_status(world: World) -> None:
    """P-5 step 1, T-3 (agent native mode): the result frame of a call uid 0 could not start
    as the agent's gid carries the errno (EPERM) and no exit status: no tool ran."""
    marker = world.out / "ran"
    run = world.without(
        ("setgid",), "run", "--native", "--agent", AGENT, "shell.exec",
        input=json.dumps({"cmd": f"touch {marker}"}),
    )  # fmt: skip
    assert not marker.exists() and TRACEBACK not in run.err, run
    result = [json.loads(line) for line in run.out.splitlines()][-1]
    assert result["type"] == "result" and result["status"] == "error", result
    assert (result["error"]["error"], result["exit_status"]) == ("EPERM", None), result


def test_a_pre_hook_uid_0_cannot_start_as_the_agent_is_not_a_veto(world: World) -> None:
    """T-6 (a pre-hook vetoes by a non-zero exit), P-5 step 1: a hook that uid 0 could not
    start as the agent never ran and vetoed nothing; the call is refused for the host's
    reason (EPERM), not blamed on the hook."""
    hook = world.storage / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-pass"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    run = world.without(
        ("setuid",), "run", "--native", "--agent", AGENT, "shell.exec",
        input=json.dumps({"cmd": f"touch {world.out}/ran"}),
    )  # fmt: skip
    assert not (world.out / "ran").exists() and TRACEBACK not in run.err, run
    error = [json.loads(line) for line in run.out.splitlines()][-1]["error"]
    assert "vetoed" not in error["message"], error
    assert error["error"] == "EPERM", error


def test_run_without_cap_sys_admin_refuses_an_offline_tool_with_eacces(world: World) -> None:
    """P-4, P-2 (default deny), T-3, T-7: without CAP_SYS_ADMIN uid 0 cannot make the network
    namespace a tool without ``network:default connect`` runs in: exit 126, ``ctx: EACCES``
    saying why, the tool not run, the call recorded with that errno."""
    marker = world.out / "ran"
    run = world.without(
        ("sys_admin",), "run", "--agent", AGENT, "shell.exec",
        input=json.dumps({"cmd": f"touch {marker}"}),
    )  # fmt: skip
    refused(run, "EACCES", rc=126)
    assert "network" in run.err and "unshare" in run.err, run
    assert not marker.exists()
    last = world.events()[-1]
    assert (last["type"], last["errno"], last["exit_status"]) == ("tool_result", "EACCES", None)


def test_run_under_dockers_default_set_runs_the_tool_as_the_agent_only(world: World) -> None:
    """P-5 step 1, T-3, T-5: with Docker's default capabilities and no_new_privs, an agent
    granted the network runs its tool with exactly its uid, gid and groups, no effective or
    permitted capability, and no_new_privs kept."""
    with open(world.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} network:default connect\n")
    script = "id -u; id -g; id -G; grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status"
    run = world.without(
        DOCKER_SET, "run", "--agent", AGENT, "shell.exec",
        input=json.dumps({"cmd": script}), nnp=True,
    )  # fmt: skip
    assert run.rc == 0 and TRACEBACK not in run.err, run
    lines = run.out.split("\n")
    assert lines[:3] == [str(NOBODY.pw_uid), str(NOBODY.pw_gid), str(NOBODY.pw_gid)], run
    fields = dict(line.split(":\t") for line in lines[3:6])
    assert fields == {"CapEff": "0" * 16, "CapPrm": "0" * 16, "NoNewPrivs": "1"}, run


# --------------------------------------------------- what uid 0 without CAP_CHOWN leaves behind


def _run_in_a_new_home(world: World) -> Run:
    return world.without(
        ("chown",), "run", "--agent", AGENT, "shell.exec",
        input=json.dumps({"cmd": f"touch {world.out}/ran"}),
    )  # fmt: skip


def _worker_in_a_new_session(world: World) -> Run:
    return world.without(
        ("chown",), "queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
        "--session", "fresh",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("command", "rc"),
    [
        pytest.param(_run_in_a_new_home, 126, id="run"),
        pytest.param(_worker_in_a_new_session, 1, id="queue-work"),
    ],
)
def test_without_cap_chown_a_refused_call_leaves_the_agents_home_as_it_was(
    world: World, command, rc: int
) -> None:
    """R-4 (``home/<uid>`` is the user's), S-1, T-3, W-1: where uid 0 cannot give the
    agent its home or session (no CAP_CHOWN) the command is refused, EPERM, claims and runs
    nothing, and leaves no directory of root's in the agent's home, which no later run by a
    full root gives back to the agent."""
    if command is not _run_in_a_new_home:
        made = world.ctx("run", "--agent", AGENT, "shell.exec", input='{"cmd": "true"}')
        assert made.rc == 0, made
    world.publish(f"touch {world.out}/ran")
    before = tree(world.storage / "home")
    pending = world.queue.entries("pending")
    run = command(world)
    refused(run, "EPERM", rc=rc)
    assert not (world.out / "ran").exists()
    assert world.queue.entries("pending") == pending
    assert tree(world.storage / "home") == before


# ------------------------------------------------------------------------------ the queue


def test_the_queue_cycle_as_uid_0_without_dac_override_on_a_group_queue(
    group_space, member
) -> None:
    """§2, Q-1 … Q-4, X-1: on a space a full root made with ``--group``, uid 0 without
    CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER publishes, claims a job a member
    published and one of its own, and finishes both; what it writes belongs to the space's
    group, so the member reads the results, and the queue is consistent."""
    world, queue = group_space
    user, gid = member
    job = json.dumps(shell_job("true"))
    theirs = as_member(user, world, "queue", "publish", "--project", SPACE, "-", input=job)
    assert theirs.returncode == 0, theirs
    mine = world.without(NO_DAC, "queue", "publish", "--project", SPACE, "-", input=job)
    assert mine.rc == 0, mine
    holder = subprocess.Popen(["sleep", "60"])
    try:
        claimed = []
        for _ in range(2):
            run = world.without(NO_DAC, "queue", "claim", "--project", SPACE,
                                "--pid", str(holder.pid))  # fmt: skip
            assert run.rc == 0, run
            claimed.append(run.out.strip())
        assert set(claimed) == {theirs.stdout.strip(), mine.out.strip()}
        for name in claimed:
            done = world.without(NO_DAC, "queue", "finish", "--project", SPACE, name, "--ok",
                                 "-", input='{"n": 1}')  # fmt: skip
            assert done.rc == 0, done
    finally:
        holder.kill()
        holder.wait()
    results = [queue.dir / "done" / f"{name}.result" for name in claimed]
    assert {path.stat().st_gid for path in results} == {gid}
    assert access_as(user, [(str(path), "r") for path in results], user.groups) == [True, True]
    queue.assert_settled()


def test_recover_and_finish_without_dac_override_leave_a_members_claim_whole(
    group_space, member
) -> None:
    """Q-4, Q-5, Q-6, I-1, I-5: a member's claim whose holder exited, in ``claimed/J`` the
    member made: uid 0 without CAP_DAC_OVERRIDE may not move out of it.  ``finish`` is
    EACCES with no result written, ``recover`` and ``recover --reconcile`` report the job as
    an EACCES error, exit 1, and change nothing; a full root's recover then requeues it."""
    world, queue = group_space
    user, _ = member
    job = abandoned_claim(world, queue, user)
    before = tree(queue.dir)
    finish = world.without(NO_DAC, "queue", "finish", "--project", SPACE, job, "--ok", "-",
                           input="{}")  # fmt: skip
    refused(finish, "EACCES")
    assert "stays claimed" in finish.err, finish
    for args in ((), ("--reconcile",)):
        run = world.without(NO_DAC, "queue", "recover", "--project", SPACE, "--json", *args)
        assert run.rc == 1 and TRACEBACK not in run.err, run
        report = run.json()
        assert report["consistent"] is False and report["requeued"] == [], report
        assert [(e["job"], e["error"]) for e in report["errors"]] == [(job, "EACCES")], report
    assert tree(queue.dir) == before
    again = world.ctx("queue", "recover", "--project", SPACE, "--json")
    assert again.rc == 0 and [e["job"] for e in again.json()["requeued"]] == [job], again
    assert queue.state(job) == "pending"


# ------------------------------------------------------------------------------ workers


def test_a_worker_that_cannot_become_the_agent_claims_nothing(world: World) -> None:
    """W-1, W-2, docs/workers.md ("A host that runs short": what every job would meet is not
    the job's failure): a worker whose uid 0 lacks CAP_SETUID and CAP_SETGID cannot run any
    job's tool as the agent; it must refuse before its first claim, EPERM, exit 1, and leave
    every job pending, none failed, none run."""
    jobs = world.publish(*(f"touch {world.out}/w{n}" for n in range(3)))
    run = world.without(
        ("setuid", "setgid"), "queue", "work", "--project", "proj", "--agent", AGENT, "--drain"
    )
    assert os.listdir(world.out) == []
    assert {world.queue.state(job) for job in jobs} == {"pending"}, run
    refused(run, "EPERM")


def test_a_worker_without_dac_override_refuses_before_its_first_claim(world: World) -> None:
    """W-1, W-2, docs/workers.md (a session it may not open: exit 1, the errno, no job
    claimed): uid 0 without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH may not enter the agent's
    home (0700, the agent's); the worker stops with EACCES naming the session, claims nothing
    and the queue is as it was."""
    made = world.ctx("run", "--agent", AGENT, "shell.exec", input='{"cmd": "true"}')
    assert made.rc == 0, made
    jobs = world.publish(f"touch {world.out}/w")
    before = tree(world.queue.dir)
    run = world.without(NO_DAC, "queue", "work", "--project", "proj", "--agent", AGENT,
                        "--drain")  # fmt: skip
    refused(run, "EACCES")
    assert "no job was claimed" in run.err and "session" in run.err, run
    assert tree(world.queue.dir) == before and world.queue.state(jobs[0]) == "pending"
    assert os.listdir(world.out) == []


def test_a_worker_without_cap_sys_admin_runs_no_tool_and_leaves_no_claim(world: World) -> None:
    """W-1, W-3, P-4, I-1: without CAP_SYS_ADMIN no tool of an agent without
    ``network:default`` can be started offline, so every job would fail alike, none by its
    own fault: the worker refuses before its first claim (EPERM naming the capability), runs
    nothing, and every job stays pending with the queue consistent."""
    jobs = world.publish(*(f"touch {world.out}/w{n}" for n in range(2)))
    run = world.without(("sys_admin",), "queue", "work", "--project", "proj", "--agent", AGENT,
                        "--drain")  # fmt: skip
    assert TRACEBACK not in run.err, run
    assert os.listdir(world.out) == []
    refused(run, "EPERM")
    assert "CAP_SYS_ADMIN" in run.err and "no job was claimed" in run.err, run
    assert {world.queue.state(job) for job in jobs} == {"pending"}, run
    assert world.queue.entries("claimed") == set() and world.queue.entries("lease") == set()
    settled = world.ctx("queue", "recover", "--project", "proj", "--json")
    assert settled.rc == 0 and settled.json()["consistent"] is True, settled


# ------------------------------------------------------------------------------ terminals


@pytest.mark.parametrize("cap", ["sys_admin", "net_admin"])
def test_agent_start_without_a_sandbox_capability_is_eperm_and_leaves_nothing(
    world: World, cap: str
) -> None:
    """A-1, A-2: the terminal's sandbox needs a mount (CAP_SYS_ADMIN) and a network namespace
    with its loopback (CAP_NET_ADMIN); uid 0 without one of them gets ``ctx: EPERM: …``,
    exit 1, no process left, nothing under /run and no link in the session."""
    session = new_session()
    with terminals_stopped(world, AGENT) as sessions:
        sessions.append(session)
        run = world.without((cap,), "agent", "start", AGENT, "--session", session,
                            "--no-workspace", "--storage", world.storage)  # fmt: skip
        assert run.rc == 1 and TRACEBACK not in run.err, run
        assert wait_for(lambda: processes_of(world.storage) == [], 30)
        assert terminal_dirs(world, AGENT, session) == []
        refused(run, "EPERM")


def test_agent_start_without_cap_setuid_is_eperm_and_leaves_nothing(world: World) -> None:
    """A-1, P-5 step 1: uid 0 that cannot switch tsh to the agent's uid starts no terminal:
    ``ctx: EPERM`` naming the failed switch or the capability, exit 1, no process, nothing
    under /run."""
    session = new_session()
    with terminals_stopped(world, AGENT) as sessions:
        sessions.append(session)
        run = world.without(("setuid", "setgid"), "agent", "start", AGENT, "--session", session,
                            "--no-workspace", "--storage", world.storage)  # fmt: skip
        refused(run, "EPERM")
        assert any(word in run.err for word in ("setresuid", "setresgid", "CAP_SETUID")), run
        assert wait_for(lambda: processes_of(world.storage) == [], 30)
        assert terminal_dirs(world, AGENT, session) == []


def _start_terminal(world: World, sessions: list[str]) -> tuple[str, Path, int]:
    session = new_session()
    sessions.append(session)
    started = world.ctx("agent", "start", AGENT, "--session", session, "--no-workspace",
                        "--storage", world.storage)  # fmt: skip
    assert started.rc == 0, started
    run_dir = RUNTIME / root_key(world.storage) / str(NOBODY.pw_uid) / AGENT / session
    assert wait_for(lambda: (run_dir / "pid").is_file(), 30)
    return session, run_dir, int((run_dir / "pid").read_text())


def test_agent_stop_without_cap_kill_or_sys_admin_ends_a_terminal_or_cleans_up_after_one(
    world: World,
) -> None:
    """A-1, A-2: ``ctx agent stop`` as uid 0 without CAP_KILL and CAP_SYS_ADMIN ends a
    terminal a full root started (a process of the same uid), which unmounts its view; and,
    after another terminal was SIGKILLed (its view still mounted, its mount process running),
    cleans up after it.  Either way: the view unmounted, no process left, nothing under /run
    and no link in the session."""
    with terminals_stopped(world, AGENT) as sessions:
        session, run_dir, pid = _start_terminal(world, sessions)
        run = world.without(("kill", "sys_admin"), "agent", "stop", AGENT, "--session", session)
        assert run.rc == 0 and run.out.startswith(f"stopped {AGENT}"), run
        assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 30)
        assert not mounted_at(run_dir / "private" / "ctx")
        assert terminal_dirs(world, AGENT, session) == []

        session, run_dir, pid = _start_terminal(world, sessions)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 30)
        assert mounted_at(run_dir / "private" / "ctx")
        run = world.without(("kill", "sys_admin"), "agent", "stop", AGENT, "--session", session)
        assert run.rc == 0 and run.out.startswith(f"cleaned up after {AGENT}"), run
        assert not mounted_at(run_dir / "private" / "ctx")
        assert wait_for(lambda: processes_of(world.storage) == [], 30)
        assert terminal_dirs(world, AGENT, session) == []


# ------------------------------------------------------------------------------ the mount


def test_mount_without_cap_sys_admin_is_eperm_and_mounts_nothing(world: World) -> None:
    """F-1, README (``ctx mount`` says when it cannot): uid 0 without CAP_SYS_ADMIN cannot
    mount FUSE: ``ctx: EPERM: cannot mount …``, exit 1, the mount point empty and unmounted,
    for the host's view and an agent's."""
    where = world.top / "mnt"
    where.mkdir()
    for view in ((), ("--as", AGENT)):
        argv = [*prefix(("sys_admin",)), *CTX_ARGV, "mount", *view, str(where)]
        proc = subprocess.Popen(argv, env=world.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            subprocess.run(["umount", "-l", str(where)], check=False)
            proc.kill()
            proc.communicate()
            pytest.fail("ctx mount without CAP_SYS_ADMIN did not end")
        refused(Run(["mount", *view], proc.returncode, out, err), "EPERM")
        assert f"cannot mount {where}" in err
        assert not mounted_at(where) and os.listdir(where) == []


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_umount_without_cap_sys_admin_is_eperm_and_keeps_the_mount(bare_world: World) -> None:
    """F-1, docs/mount.md (``ctx umount``: EPERM for a mount the caller may not unmount, EBUSY
    for one in use): uid 0 without CAP_SYS_ADMIN may not unmount a mount a full root made;
    it says EPERM, exit 1, and the mount keeps serving."""
    world = bare_world
    where = world.top / "mnt"
    where.mkdir()
    with serving(world.storage, where):
        run = world.without(("sys_admin",), "umount", where)
        assert run.rc == 1 and mounted_at(where), run
        assert set(os.listdir(where)) == ROOT_ENTRIES
        refused(run, "EPERM")


# ------------------------------------------------------------------------------ sessions


def _torn_session(world: World) -> Path:
    made = world.ctx("run", "--agent", AGENT, "shell.exec", input='{"cmd": "true"}')
    assert made.rc == 0, made
    events = world.home / "agent" / AGENT / "session" / "default" / "events.jsonl"
    with open(events, "ab") as file:
        file.write(b'{"ts": "torn')
    return events


def test_session_repair_without_dac_override_cuts_nothing_and_says_eacces(world: World) -> None:
    """S-5: a torn last line in the agent's ``events.jsonl`` (0600, the agent's): uid 0 without
    CAP_DAC_OVERRIDE may not write it, so ``ctx session repair`` is EACCES, exit 1, and the
    file is as it was; a full root's repair then cuts exactly the torn bytes."""
    events = _torn_session(world)
    before = events.read_bytes()
    for drop in (("dac_override",), NO_DAC):
        run = world.without(drop, "session", "repair", AGENT)
        refused(run, "EACCES")
        assert events.read_bytes() == before
    full = world.ctx("session", "repair", AGENT, "--json")
    assert full.rc == 0 and full.json()["truncated_bytes"] == len(b'{"ts": "torn'), full
    assert before.endswith(b"\n" + b'{"ts": "torn') and events.read_bytes() == before[:-12]


def test_session_repair_without_cap_fowner_names_what_it_cannot_tighten(world: World) -> None:
    """S-5, ``ctx session repair --help`` (an older session made 0700/0600 first, each named):
    uid 0 without CAP_FOWNER may not chmod the agent's session; the refusal is EPERM naming
    the session and what to do, and nothing is changed."""
    made = world.ctx("run", "--agent", AGENT, "shell.exec", input='{"cmd": "true"}')
    assert made.rc == 0, made
    session = world.home / "agent" / AGENT / "session" / "default"
    session.chmod(0o750)
    (session / "events.jsonl").chmod(0o640)
    before = tree(session)
    run = world.without(("fowner",), "session", "repair", AGENT)
    refused(run, "EPERM")
    assert tree(session) == before
    assert str(session) in run.err, run


# ------------------------------------------------------------------------------ the words


def _message_of_bootstrap(world: World, user) -> str:
    return bootstrap_without_dac_override(world.top, user)[0].err


def _message_of_recover(world: World, user) -> str:
    world.ctx("shared", "create", SPACE, "--group", GROUP)
    job = abandoned_claim(world, QueueCLI(world.storage, SPACE), user)
    run = world.without(NO_DAC, "queue", "recover", "--project", SPACE, "--json")
    assert run.rc == 1, run
    (error,) = run.json()["errors"]
    assert error["job"] == job, run
    return error["detail"]


def _message_of_session_repair(world: World, user) -> str:
    _torn_session(world)
    return world.without(("dac_override",), "session", "repair", AGENT).err


def _message_of_shared_create(world: World, user) -> str:
    return world.without(("chown",), "shared", "create", SPACE, "--group", GROUP).err


@pytest.mark.parametrize(
    "said",
    [
        pytest.param(_message_of_bootstrap, id="bootstrap"),
        pytest.param(_message_of_recover, id="queue-recover"),
        pytest.param(_message_of_session_repair, id="session-repair"),
        pytest.param(_message_of_shared_create, id="shared-create"),
    ],
)
def test_a_refusal_for_a_missing_capability_names_it(world: World, member, said) -> None:
    """CONVENTIONS ("Errors carry an errno and a sentence a user can act on"), README ("each
    says so, and what to do"): a command refused to uid 0 because a capability is missing
    (CAP_DAC_OVERRIDE for bootstrap, recover and session repair, CAP_CHOWN for shared
    create) names that capability instead of telling uid 0 to run as root."""
    message = said(world, member[0])
    assert message and TRACEBACK not in message, message
    assert names_what_is_missing(message), message
