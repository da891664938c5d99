"""End-to-end flows of uids and gids that the user and group databases do not name, as on hosts
that run CortexFS in containers (``docker run --user 12345:12345``) or for agents whose
``identity`` control holds bare numbers (SPEC A-3, T-5, P-5 step 1, R-1, X-1, §2.4, Q-3, W-1,
S-1): processes started with ``setpriv``-style credentials and no ``HOME``, ``USER`` or
``LOGNAME``; agents with long lists of supplementary gids that have no names; users and groups
whose *names* are the numbers of the agent's ids (setpriv reads such an argument as a name
first); database users with a ``nologin`` shell and a home that is missing or empty.

Every account a test needs is made for real (``useradd``/``groupadd``, or a uid that exists
nowhere) within a block of ids the test owns, and removed again.  The checks: tools, hooks,
workers and terminals run with exactly the agent's numbers and groups, never a namesake's;
refusals are ``ctx: ERRNO: …`` lines, never a traceback; the default storage root of a uid
without a home is refused with the path and what to do."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("setpriv") is None
    or shutil.which("useradd") is None
    or shutil.which("groupadd") is None,
    reason="needs root, setpriv, useradd and groupadd to make and act as uids without names",
)

SCRATCH = scratch_top(__file__)
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# The lock tests/support/users.py takes around useradd/groupadd: xdist workers race the
# databases' own locks otherwise.
ACCOUNTS_LOCK = Path(tempfile.gettempdir()) / "cortexfs-test-accounts.lock"
BLOCK = 100  # each test owns the ids BASE .. BASE + 99, as numbers and as names
USERS_GID = 100  # Debian's group "users": the primary group of the accounts made here
# What a tool or hook prints of its own credentials, as the kernel holds them.
SHOW_IDS = "grep -E '^(Uid|Gid|Groups):' /proc/self/status"
SECRET = "only-for-the-group-left-out"


# ------------------------------------------------------------------------------ accounts


@contextlib.contextmanager
def accounts_lock() -> Iterator[None]:
    with open(ACCOUNTS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _user_named(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _group_named(name: str) -> grp.struct_group | None:
    try:
        return grp.getgrnam(name)
    except KeyError:
        return None


def _numbered(number: int) -> bool:
    """Whether a user or a group has ``number`` as its id."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        with contextlib.suppress(KeyError):
            lookup(number)
            return True
    return False


def _ours(name: str, base: int) -> bool:
    return name.startswith("ctxnl-") or (name.isdigit() and base <= int(name) < base + BLOCK)


def id_block(base: int) -> range:
    """The ids ``base`` .. ``base + BLOCK - 1``, once no user or group has one of them as its
    number or its name.  Accounts an interrupted run of this file left there (named
    ``ctxnl-…`` or by a number of the block, with an id in it) are removed first."""
    block = range(base, base + BLOCK)
    with accounts_lock():
        for user in pwd.getpwall():
            if user.pw_uid in block and _ours(user.pw_name, base):
                subprocess.run(["userdel", "-f", user.pw_name], capture_output=True, check=False)
        for group in grp.getgrall():
            if group.gr_gid in block and _ours(group.gr_name, base):
                subprocess.run(["groupdel", group.gr_name], capture_output=True, check=False)
        for number in block:
            if _numbered(number) or _user_named(str(number)) or _group_named(str(number)):
                pytest.skip(f"id {number} is known to this host; the block {base}.. is needed")
    return block


@dataclass
class Accounts:
    """Users and groups made for one test, removed at its end."""

    users: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def group(self, name: str, gid: int) -> None:
        with accounts_lock():
            subprocess.run(["groupadd", "--gid", str(gid), name], check=True, capture_output=True)
        self.groups.append(name)

    def user(self, name: str, uid: int, home: str = "/nonexistent") -> None:
        """A user with no home made, the shell ``nologin`` and the primary group ``users``."""
        argv = ["useradd", "--no-create-home", "--no-user-group", "--gid", str(USERS_GID)]
        argv += ["--uid", str(uid), "--home-dir", home, "--shell", "/usr/sbin/nologin", name]
        with accounts_lock():
            subprocess.run(argv, check=True, capture_output=True)
        self.users.append(name)

    def empty_home(self, name: str) -> None:
        """Make the home field of ``name``'s password entry empty, as some images ship it
        (useradd refuses an empty --home-dir), under the password database's own lock."""
        libc = ctypes.CDLL(None, use_errno=True)
        with accounts_lock():
            assert libc.lckpwdf() == 0, os.strerror(ctypes.get_errno())
            try:
                lines = Path("/etc/passwd").read_text().splitlines(keepends=True)
                edited = []
                for line in lines:
                    fields = line.split(":")
                    if fields[0] == name:
                        fields[5] = ""
                    edited.append(":".join(fields))
                temp = Path("/etc/passwd.ctxnl")
                temp.write_text("".join(edited))
                temp.chmod(0o644)
                os.rename(temp, "/etc/passwd")
            finally:
                libc.ulckpwdf()
        assert pwd.getpwnam(name).pw_dir == ""

    def remove(self) -> None:
        with accounts_lock():
            for name in self.users:
                subprocess.run(["userdel", "-f", name], capture_output=True, check=False)
            for name in self.groups:
                subprocess.run(["groupdel", name], capture_output=True, check=False)


@pytest.fixture
def accounts() -> Iterator[Accounts]:
    made = Accounts()
    try:
        yield made
    finally:
        made.remove()


# ------------------------------------------------------------------------------ processes


@dataclass(frozen=True)
class Ids:
    """Credentials to run a process with: numbers only, whatever the databases say."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


def as_ids(
    ids: Ids,
    argv: list[str],
    env: dict[str, str],
    stdin: str = "",
    cwd: str = "/",
) -> subprocess.CompletedProcess[str]:
    """``argv`` with exactly ``ids`` (as ``setpriv --reuid --regid --groups`` gives them),
    umask 022, in ``env`` and nothing else."""
    return subprocess.run(
        argv,
        input=stdin,
        user=ids.uid,
        group=ids.gid,
        extra_groups=list(ids.groups),
        umask=0o022,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ctx_as(ids: Ids, env: dict[str, str], *args: str | os.PathLike, stdin: str = ""):
    return as_ids(ids, [*CTX_ARGV, *map(str, args)], env, stdin)


def bare_env(**extra: str) -> dict[str, str]:
    """What a container runtime gives a uid it has no name for: a PATH, nothing else."""
    return {"PATH": PATH, **extra}


def processes_with_uid(uids: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) in uids:
                    found.append(int(entry.name))
    return found


def kill_uids(uids: set[int]) -> None:
    for pid in processes_with_uid(uids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def kernel_ids(text: str) -> tuple[list[int], list[int], list[int]]:
    """Uid (real, effective, saved, fs), Gid (the same) and Groups of a /proc status."""
    seen = {}
    for line in text.splitlines():
        key, _, values = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            seen[key] = [int(v) for v in values.split()]
    return seen["Uid"], seen["Gid"], sorted(seen["Groups"])


def assert_exactly(text: str, ids: Ids) -> None:
    uids, gids, groups = kernel_ids(text)
    assert uids == [ids.uid] * 4, text
    assert gids == [ids.gid] * 4, text
    assert groups == sorted(ids.groups), text


def result_frame(out: str) -> dict:
    frames = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", out
    return frames[-1]


def refusal(done, errno_name: str) -> None:
    """An errno-style refusal on stderr, and no Python traceback anywhere."""
    err = done.stderr if hasattr(done, "stderr") else done.err
    assert f"ctx: {errno_name}: " in err, err
    assert "Traceback" not in err and "KeyError" not in err, err


@dataclass
class Root:
    """A copy of the bootstrapped storage root that every uid may search, driven as root."""

    storage: Path
    top: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args: str | os.PathLike, stdin: str = ""):
        return ctx_run(*args, input=stdin, env=self.env)

    def agent(self, name: str, *options: str, **request) -> dict:
        body = {"name": name, "label": f"{name}_t", "tools": ["shell.exec"], **request}
        made = self.ctx("agent", "create", "-", "--json", *options, stdin=json.dumps(body))
        assert made.rc == 0, made
        with (self.storage / "tool" / "shell.exec.d" / "policy").open("a") as policy:
            policy.write(f"allow {name}_t tool:shell.exec execute\n")
        return made.json()

    def call(self, agent: str, cmd: str, *options: str):
        argv = ("run", "--native", "--agent", agent, *options, "shell.exec")
        return self.ctx(*argv, stdin=json.dumps({"cmd": cmd}))


@pytest.fixture
def root(searchable_storage: Path) -> Iterator[Root]:
    top = new_scratch_dir(SCRATCH, "r")
    try:
        yield Root(searchable_storage, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------


def test_a_uid_without_a_home_is_refused_its_default_root_with_the_path_and_what_to_do(
    accounts: Accounts,
) -> None:
    """R-1 (the embedded default of a non-root user is ``$XDG_DATA_HOME/cortexfs/storage/
    current``, ``~/.local/share`` when it is unset), docs/spec/ctx.root-abi.md, README (errors
    read ``ctx: ERRNO: what to do``): a uid in no database with no HOME, with Docker's
    ``HOME=/``, with a HOME that does not exist or is relative, and database users whose home
    is missing or empty, are refused the default root with EACCES naming the root it would be
    and --storage/CTX_STORAGE, exit 1, nothing made; with a HOME of its own and ``USER=root``
    the same uid gets a root below that HOME, its own, not root's system default."""
    base = id_block(47100)[0]
    missing_home = f"/nonexistent-{base}/home"
    accounts.user(f"ctxnl-m{base}", base + 1, home=missing_home)
    accounts.user(f"ctxnl-e{base}", base + 2)
    accounts.empty_home(f"ctxnl-e{base}")
    nameless = Ids(base, base, (base + 3, base + 4))
    cases = [
        (nameless, bare_env(), "/"),
        (nameless, bare_env(HOME="/"), "/"),
        (nameless, bare_env(HOME=missing_home), missing_home),
        (nameless, bare_env(HOME="relative/home"), "/"),
        (Ids(base + 1, USERS_GID), bare_env(), missing_home),
        (Ids(base + 2, USERS_GID), bare_env(), "/"),
    ]
    made_before = os.path.exists("/.local")
    for ids, env, home in cases:
        expected = os.path.join(home, ".local/share/cortexfs/storage/current")
        for args in (("bootstrap",), ("queue", "init", "--project", "p")):
            done = ctx_as(ids, env, *args)
            assert done.returncode == 1, (ids, env, done)
            refusal(done, "EACCES")
            assert expected in done.stderr, (ids, env, done.stderr)
            assert "--storage DIR or CTX_STORAGE" in done.stderr, done.stderr
            assert done.stdout == "", done.stdout
    assert os.path.exists("/.local") == made_before
    assert not os.path.exists(f"/nonexistent-{base}")

    top = new_scratch_dir(SCRATCH, "h")
    try:
        home = top / "home"
        home.mkdir()
        os.chown(home, base, base)
        env = bare_env(HOME=str(home), USER="root", LOGNAME="root")
        made = ctx_as(nameless, env, "bootstrap")
        assert made.returncode == 0, made
        own = home / ".local/share/cortexfs/storage/current"
        assert (own / "shared" / "cortexfs-docs").is_dir()
        assert (own.stat().st_uid, own.stat().st_gid) == (base, base)
        status = ctx_as(nameless, env, "queue", "init", "--project", "p", "--json")
        assert status.returncode == 0, status
        assert str(own) in status.stdout, status.stdout
        # With no login name anywhere, `from` (docs/queue.md: "else the user") names the uid.
        job = ctx_as(nameless, bare_env(HOME=str(home)), "queue", "publish", "-p", "p", "-",
                     stdin='{"tool": "fs.stat", "input": {"path": "/"}}')  # fmt: skip
        assert job.returncode == 0, job
        stored = json.loads((own / "shared/p/queue/pending" / job.stdout.strip()).read_text())
        assert str(base) in stored["from"] and stored["from"] != "root", stored
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ T-5, W-1


def test_tools_hooks_and_workers_run_as_the_agents_numbers_where_names_read_as_other_ids(
    root: Root, accounts: Accounts, outbox: Path
) -> None:
    """A-3, T-5, T-6, W-1, S-1, P-5 step 1, docs/tools.md (setpriv reads an id as a name first;
    the agent never runs as the namesake's id): an agent whose uid, gid and forty
    supplementary gids have no names, with a user named like its uid and groups named like its
    gid and one of its groups that have other ids.  ``--user UID`` alone is EINVAL (exit 2,
    nothing made), not the namesake; the tool in both modes, its pre- and post-hooks and a
    worker's job all run with exactly the agent's numbers; its session is in home/<uid>/,
    owned by those numbers; its terminal refuses to start with EINVAL naming the namesakes,
    leaving nothing running."""
    base = id_block(47200)[0]
    ids = Ids(base, base + 1, tuple(range(base + 2, base + 42)))
    namesake_uid, namesake_gid, namesake_group = base + 50, base + 51, base + 52
    accounts.user(str(ids.uid), namesake_uid)
    accounts.group(str(ids.gid), namesake_gid)
    accounts.group(str(ids.groups[3]), namesake_group)

    alone = root.ctx("agent", "create", "-", "--user", str(ids.uid),
                     stdin='{"name": "nl", "label": "nl_t"}')  # fmt: skip
    assert alone.rc == 2, alone
    refusal(alone, "EINVAL")
    assert "--gid" in alone.err, alone.err
    assert not (root.storage / "agent" / "nl").exists()

    groups = ",".join(map(str, ids.groups))
    made = root.agent("nl", "--user", str(ids.uid), "--gid", str(ids.gid), "--groups", groups)
    assert made["identity"] == {"uid": ids.uid, "gid": ids.gid, "groups": list(ids.groups)}

    hooks = root.storage / "tool" / "shell.exec.d" / "hooks"
    for stage in ("pre", "post"):
        hook = hooks / f"{stage}.d" / "10-ids"
        hook.write_text(f"#!/bin/sh\n{SHOW_IDS} > {outbox}/{stage}\ncat > /dev/null\nexit 0\n")
        hook.chmod(0o755)

    native = root.call("nl", SHOW_IDS)
    assert native.rc == 0, native
    result = result_frame(native.out)
    assert result["status"] == "ok", result
    assert_exactly(result["output"], ids)
    for stage in ("pre", "post"):
        assert_exactly((outbox / stage).read_text(), ids)

    terminal = root.ctx("run", "--agent", "nl", "shell.exec", stdin=json.dumps({"cmd": SHOW_IDS}))
    assert terminal.rc == 0, terminal
    assert_exactly(terminal.out, ids)

    request = json.dumps({"tool": "shell.exec", "input": {"cmd": SHOW_IDS}})
    published = root.ctx("queue", "publish", "-p", "proj", "-", stdin=request)
    assert published.rc == 0, published
    job = published.out.strip()
    worked = root.ctx("queue", "work", "-p", "proj", "--agent", "nl", "--drain")
    assert worked.rc == 0, worked
    stored = json.loads((root.storage / f"shared/proj/queue/done/{job}.result").read_text())
    assert stored["status"] == "ok", stored
    assert_exactly(stored["output"], ids)

    sessions = root.storage / "home" / str(ids.uid) / "agent" / "nl" / "session"
    for session in ("default", "worker"):
        events = sessions / session / "events.jsonl"
        assert (events.stat().st_uid, events.stat().st_gid) == (ids.uid, ids.gid), session
        assert any(e.get("type") == "tool_result" for e in read_jsonl(events)), session
    assert not (root.storage / "home" / str(namesake_uid)).exists()

    workspace = root.top / "ws"
    workspace.mkdir(mode=0o755)
    try:
        start = root.ctx("agent", "start", "nl", "--session", "t1", "--workspace", workspace)
        assert start.rc == 1, start
        refusal(start, "EINVAL")
        assert f"the user named {ids.uid} is uid {namesake_uid}" in start.err, start.err
        assert f"the group named {ids.gid} is gid {namesake_gid}" in start.err, start.err
        assert f"the group named {ids.groups[3]} is gid {namesake_group}" in start.err
        assert processes_with_uid({ids.uid, namesake_uid}) == []
        log = read_jsonl(root.storage / "agent" / "nl.d" / "log")
        assert not [e for e in log if e.get("type") == "terminal.started"], log
    finally:
        root.ctx("agent", "stop", "nl", "--session", "t1")
        kill_uids({ids.uid, namesake_uid})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent terminal needs bubblewrap")
def test_the_terminal_of_a_nameless_identity_runs_tsh_with_exactly_its_numbers(
    root: Root,
) -> None:
    """A-1, H-1, T-5, docs/tools.md (tsh runs as the agent's uid, gid and groups, with no
    capabilities, ``no_new_privs``; ``HOME`` is ``/workspace``): with no names for any of its
    ids (and none named like them), the agent's terminal starts, and its tsh holds exactly the
    identity control's numbers; ``ctx agent stop`` leaves no process of that uid."""
    base = id_block(47300)[0]
    ids = Ids(base, base + 1, tuple(range(base + 2, base + 26)))
    groups = ",".join(map(str, ids.groups))
    root.agent("term", "--user", str(ids.uid), "--gid", str(ids.gid), "--groups", groups)
    workspace = root.top / "ws"
    workspace.mkdir(mode=0o755)
    try:
        start = root.ctx("agent", "start", "term", "--session", "t1", "--workspace", workspace)
        assert start.rc == 0, start
        assert wait_for(lambda: processes_with_uid({ids.uid}) != [], 30)
        tsh = [
            pid
            for pid in processes_with_uid({ids.uid})
            if b"/ctx/bin/tsh" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(tsh) == 1, tsh
        status = Path(f"/proc/{tsh[0]}/status").read_text()
        assert_exactly(status, ids)
        assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status, status
        environ = Path(f"/proc/{tsh[0]}/environ").read_bytes().split(b"\0")
        assert b"HOME=/workspace" in environ, environ
        stop = root.ctx("agent", "stop", "term", "--session", "t1")
        assert stop.rc == 0, stop
        assert wait_for(lambda: processes_with_uid({ids.uid}) == [], 30)
    finally:
        root.ctx("agent", "stop", "term", "--session", "t1")
        kill_uids({ids.uid})


# ------------------------------------------------------------------------------ X-1, §2.4


def test_members_by_a_nameless_gid_work_a_spaces_queue_and_an_agent_of_that_gid_drains_it(
    root: Root,
) -> None:
    """X-1, §2.4, Q-1, Q-3, Q-5, W-1, S-1, S-6: ``ctx shared create sp --group GID`` with a gid
    no group database names; two uids in no database that hold that gid publish, claim from a
    shell that exits (the lease names its holder by host, boot id, pid namespace and pid) and
    recover; a third uid without it is refused every verb (EACCES naming the gid, exit 1,
    queue unchanged); root's worker for an agent of that gid drains the queue as that agent's
    numbers, and the agent's calls in the space record a session there owned by its uid and
    the space's gid, while an agent outside the gid is refused at step 2."""
    base = id_block(47400)[0]
    gid = base
    a, b = Ids(base + 1, base + 1, (gid,)), Ids(base + 2, base + 2, (gid,))
    outsider = Ids(base + 3, base + 3)
    made = root.ctx("shared", "create", "sp", "--group", str(gid))
    assert made.rc == 0, made
    space = root.storage / "shared" / "sp"
    assert space.stat().st_gid == gid
    env = bare_env(CTX_STORAGE=str(root.storage))

    request = json.dumps({"tool": "shell.exec", "input": {"cmd": SHOW_IDS}})
    jobs = []
    for _ in range(3):
        published = ctx_as(a, env, "queue", "publish", "-p", "sp", "-", stdin=request)
        assert published.returncode == 0, published
        jobs.append(published.stdout.strip())
    queue = space / "queue"
    first = json.loads((queue / "pending" / jobs[0]).read_text())
    assert str(a.uid) in first["from"], first

    shell = ["/bin/sh", "-c", '"$@"; true', "sh", *CTX_ARGV, "queue", "claim", "-p", "sp"]
    claimed = as_ids(b, shell, env)
    assert claimed.returncode == 0, claimed
    job = claimed.stdout.strip()
    lease_file = queue / "lease" / job / "worker"
    assert (lease_file.stat().st_uid, lease_file.stat().st_gid) == (b.uid, gid)
    lease = json.loads(lease_file.read_text())
    for key in ("worker", "host", "boot_id", "pid_ns", "pid", "claimed_at", "expires_at"):
        assert key in lease, (key, lease)
    recovered = ctx_as(a, env, "queue", "recover", "-p", "sp", "--json")
    assert recovered.returncode == 0, recovered
    assert job in json.dumps(json.loads(recovered.stdout)["requeued"]), recovered.stdout

    before = snapshot(queue)
    for args, stdin in (
        (("publish", "-p", "sp", "-"), request),
        (("claim", "-p", "sp"), ""),
        (("status", "-p", "sp"), ""),
        (("recover", "-p", "sp", "--reconcile"), ""),
    ):
        refused = ctx_as(outsider, env, "queue", *args, stdin=stdin)
        assert refused.returncode == 1, (args, refused)
        refusal(refused, "EACCES")
        assert f"group {gid}" in refused.stderr, refused.stderr
    assert snapshot(queue) == before

    member = Ids(base + 10, base + 10, (gid,))
    root.agent("mem", "--user", str(member.uid), "--gid", str(member.gid), "--groups", str(gid),
               shared={"sp": "read write"})  # fmt: skip
    worked = root.ctx("queue", "work", "-p", "sp", "--agent", "mem", "--drain")
    assert worked.rc == 0, worked
    assert sorted(os.listdir(queue / "pending")) == []
    for name in jobs:
        stored = json.loads((queue / "done" / f"{name}.result").read_text())
        assert stored["status"] == "ok", stored
        assert_exactly(stored["output"], member)

    recorded = root.call("mem", "true", "--project", "sp")
    assert recorded.rc == 0, recorded
    events = space / "agent" / "mem" / "session" / "default" / "events.jsonl"
    assert (events.stat().st_uid, events.stat().st_gid) == (member.uid, gid)

    stranger = Ids(base + 11, base + 11)
    root.agent("out", "--user", str(stranger.uid), "--gid", str(stranger.gid),
               shared={"sp": "read write"})  # fmt: skip
    kept_out = root.call("out", "true", "--project", "sp")
    assert kept_out.rc == 1, kept_out
    error = result_frame(kept_out.out)["error"]
    assert error["errno"] == 13 and error["step"] == 2, error
    assert not (space / "agent" / "out").exists()


# ------------------------------------------------------------------------------ non-root


def test_a_non_root_host_does_not_run_a_tool_with_groups_its_agents_identity_leaves_out() -> None:
    """T-5 (permission comes from the agent's uid/gid/groups), P-5 step 1 (exec uid/gid), A-3,
    docs/tools.md (a non-root user "can give an agent only your own uid and groups"): a uid in
    no database, holding gids G1 and G2, bootstraps its own root and creates an agent with
    ``--groups G1``; ``ctx agent show`` reports groups G1 only.  A tool of that agent, run by
    the same uid, must not read a file that only G2 may read: the call is refused, or the
    kernel refuses the read."""
    base = id_block(47500)[0]
    ids = Ids(base, base, (base + 1, base + 2))
    top = new_scratch_dir(SCRATCH, "n")
    try:
        home = top / "home"
        home.mkdir()
        os.chown(home, ids.uid, ids.gid)
        secret = top / "secret"
        secret.write_text(SECRET + "\n")
        os.chown(secret, 0, base + 2)
        secret.chmod(0o640)
        env = bare_env(HOME=str(home))
        assert ctx_as(ids, env, "bootstrap").returncode == 0
        request = json.dumps({"name": "sub", "label": "sub_t", "tools": ["shell.exec"]})
        made = ctx_as(ids, env, "agent", "create", "-", "--groups", str(base + 1), stdin=request)
        assert made.returncode == 0, made
        shown = ctx_as(ids, env, "agent", "show", "sub", "--json")
        assert json.loads(shown.stdout)["identity"]["groups"] == [base + 1], shown.stdout
        policy = home / ".local/share/cortexfs/storage/current/tool/shell.exec.d/policy"
        grant = 'echo "allow sub_t tool:shell.exec execute" >> "$1"'
        granted = as_ids(ids, ["/bin/sh", "-c", grant, "sh", str(policy)], env)
        assert granted.returncode == 0, granted
        call = ctx_as(ids, env, "run", "--native", "--agent", "sub", "shell.exec",
                      stdin=json.dumps({"cmd": f"cat {secret}"}))  # fmt: skip
        assert "Traceback" not in call.stderr, call.stderr
        assert SECRET not in call.stdout, call.stdout
    finally:
        kill_uids({ids.uid})
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ homes


def test_an_agent_of_a_nologin_user_with_a_missing_home_runs_with_its_database_ids(
    root: Root, accounts: Accounts
) -> None:
    """A-3 (``--user NAME``: its primary group and groups from the user database), T-5,
    docs/tools.md Environment (``HOME``: the agent user's home): a database user whose shell
    is ``/usr/sbin/nologin`` and whose home does not exist; the agent's tool runs (the shell
    of the password entry plays no part) with that user's uid, its primary group and the
    groups the database gives it, and HOME as the entry says, nothing made there."""
    base = id_block(47700)[0]
    home = f"/nonexistent-{base}/home"
    accounts.user(f"ctxnl-n{base}", base, home=home)
    made = root.agent("nologin", "--user", f"ctxnl-n{base}")
    assert made["identity"] == {"uid": base, "gid": USERS_GID, "groups": [USERS_GID]}
    done = root.call("nologin", f'printf "%s\\n" "$HOME"; {SHOW_IDS}')
    assert done.rc == 0, done
    output = result_frame(done.out)["output"]
    assert output.splitlines()[0] == home
    assert_exactly(output.split("\n", 1)[1], Ids(base, USERS_GID, (USERS_GID,)))
    assert not os.path.exists(f"/nonexistent-{base}")


def test_an_agent_of_a_user_with_an_empty_home_field_gets_home_slash(
    root: Root, accounts: Accounts
) -> None:
    """T-5, A-3, docs/tools.md Environment (``HOME``: "the agent user's home (or ``/``)"),
    and the product's own reading of such an entry for the storage root (R-1: an empty home
    counts as ``/``): the tool of an agent of a user whose password entry has an empty home
    field gets ``HOME=/``, not an empty HOME that makes ``$HOME/.cache`` a path below the
    tool's working directory."""
    base = id_block(47600)[0]
    name = f"ctxnl-e{base}"
    accounts.user(name, base)
    accounts.empty_home(name)
    root.agent("emptyhome", "--user", name)
    done = root.call("emptyhome", 'printf "HOME=%s." "$HOME"')
    assert done.rc == 0, done
    assert result_frame(done.out)["output"] == "HOME=/."
