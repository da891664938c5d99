"""``ctx`` run as uid 0 of a user namespace that maps only part of the machine's ids, as rootless
containers run it (SPEC R-4, R-5, X-1, A-1, A-3, P-5 step 1, T-5, W-1, Q-3, Q-5, I-1).

Two kinds of namespace are used.  ``unshare --user --map-root-user`` run by the unprivileged
test user maps that one uid (and gid) to 0 and denies setgroups; every other id of the machine
is unmapped: files and processes of other users show as 65534, chown to them is EINVAL, and no
process can become them.  The second kind is what podman rootless makes through newuidmap:
root writes the maps of a namespace the test user created, uid 0 inside being that user and
1…65536 a subordinate range (here 100000…165535), with setgroups allowed or denied.

Inside, uid 0 holds every capability, yet it cannot act as an unmapped id.  What is checked:
that a command either works with the ids it may use, or refuses with ``ctx: ERRNO: …`` naming
the cause, with nothing half made and no tool run under any id but the agent's; that a tool runs
with exactly the agent's mapped ids and no capability; and that leases written outside the
namespace are judged as Q-5 says.  (Capability sets smaller than root's, and pid, UTS and mount
namespaces, are the subject of their own files.)"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import shell_job
from tests.support.users import UnprivilegedUser, members_of
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
SPACE, GROUP, MEMBER = "den", "ctxrl-g", "ctxrl-m"
AGENT, LABEL = "ci", "ci_t"
TRACEBACK = "Traceback (most recent call last)"
WAIT = 40.0  # seconds: the bound of every wait (only a hang reaches it)
SUB, RANGE = 100000, 65536  # the subordinate range: outside ids SUB … SUB + RANGE - 1
NOBODY_INSIDE = 65534
NOBODY_OUTSIDE = SUB + NOBODY_INSIDE - 1
RUN_BASE = Path("/run/cortexfs/terminal")
# The namespace's first process waits until root has written its maps, then execs the command.
MAPPED_YET = 'until [ "$(id -u):$(id -g)" = 0:0 ]; do sleep 0.02; done; exec "$@"'


# ------------------------------------------------------------------------------ what works here


def _userns_refusal(user: UnprivilegedUser) -> str | None:
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
    )
    return None if done.returncode == 0 else done.stderr.strip() or str(done.returncode)


@pytest.fixture
def user(unprivileged_user: UnprivilegedUser) -> UnprivilegedUser:
    """The unprivileged test user, able to make a user namespace here (else skipped)."""
    reason = _userns_refusal(unprivileged_user)
    if reason is not None:
        pytest.skip(f"{unprivileged_user.name} cannot make a user namespace here: {reason}")
    return unprivileged_user


@pytest.fixture
def member() -> tuple[UnprivilegedUser, int]:
    """A second real user, a member of group ``ctxrl-g``: ids no namespace here maps."""
    (who,), gid = members_of(GROUP, MEMBER)
    return who, gid


@pytest.fixture
def box(user: UnprivilegedUser) -> Iterator[Path]:
    """A scratch directory (0755) of the test user's, where it keeps its own storage root."""
    made = new_scratch_dir(SCRATCH, "u")
    os.chown(made, user.uid, user.gid)
    try:
        yield made
    finally:
        kill_processes_of(made)
        shutil.rmtree(made, ignore_errors=True)


def user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), PATH="/usr/bin:/bin:/usr/sbin:/sbin", CTX=CTX_ARGV[0])
    env.update(extra)
    return env


def as_run(argv: Sequence[str], done: subprocess.CompletedProcess) -> Run:
    return Run(list(argv), done.returncode, done.stdout, done.stderr)


def refused(run: Run, code: str, rc: int = 1) -> None:
    """``run`` ended with ``ctx: CODE: …`` as the last line of stderr, exit ``rc``."""
    assert TRACEBACK not in run.err, run
    lines = run.err.splitlines()
    assert run.rc == rc and lines and lines[-1].startswith(f"ctx: {code}: "), run


def names_the_namespace(message: str) -> bool:
    return any(word in message for word in ("user namespace", "not mapped", "maps no", "uid_map"))


# ------------------------------------------------------------------------------ unshare -r


@dataclass
class Rootless:
    """The test user's own storage root ``box/st``, used from ``unshare --map-root-user``."""

    user: UnprivilegedUser
    box: Path

    @property
    def storage(self) -> Path:
        return self.box / "st"

    def sh(self, shell: str, *unshare: str, groups: Sequence[int] = ()) -> Run:
        """``sh -c SHELL`` as the user, uid 0 of a new user namespace (``unshare`` options
        added), with ``groups`` kept as supplementary groups (shown there as 65534)."""
        argv = ["unshare", "--user", "--map-root-user", *unshare, "sh", "-c", shell]
        env = user_env(self.box, CTX_STORAGE=str(self.storage))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT,
                              cwd=self.box, user=self.user.uid, group=self.user.gid,
                              extra_groups=list(groups))  # fmt: skip
        return as_run(argv, done)

    def ctx(self, *args: str, input: str = "", unshare: Sequence[str] = ()) -> Run:
        argv = ["unshare", "--user", "--map-root-user", *unshare, *CTX_ARGV, *args]
        env = user_env(self.box, CTX_STORAGE=str(self.storage))
        done = subprocess.run(argv, input=input, env=env, capture_output=True, text=True,
                              timeout=WAIT, cwd=self.box, user=self.user.uid,
                              group=self.user.gid, extra_groups=[])  # fmt: skip
        return as_run(args, done)


@pytest.fixture
def rootless(user: UnprivilegedUser, box: Path) -> Rootless:
    """The user's root, bootstrapped by its own ``ctx bootstrap`` as uid 0 of a namespace."""
    world = Rootless(user, box)
    made = world.ctx("bootstrap")
    assert made.rc == 0 and TRACEBACK not in made.err, made
    return world


def create_agent(world: Rootless, name: str, *options: str) -> dict:
    req = {"name": name, "label": f"{name}_t", "tools": ["shell.exec"]}
    made = world.ctx("agent", "create", "-", "--json", *options, input=json.dumps(req))
    assert made.rc == 0, made
    with open(world.storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write(f"allow {name}_t tool:shell.exec execute\n")
    return made.json()


# ------------------------------------------------------------------------------ subordinate ids


def in_mapped_namespace(
    argv: Sequence[str],
    user: UnprivilegedUser,
    *,
    deny_setgroups: bool = False,
    groups: Sequence[int] = (),
    env: dict[str, str],
    cwd: Path,
    input: str = "",
) -> Run:
    """``argv`` as uid 0 of a user namespace ``user`` made, whose maps root writes as newuidmap
    would for a rootless container: 0 is ``user`` (its uid and gid), 1 … 65536 the subordinate
    ids 100000 …; ``deny_setgroups`` writes ``deny`` to its setgroups first."""
    own = os.stat("/proc/self/ns/user").st_ino
    proc = subprocess.Popen(
        ["unshare", "--user", "sh", "-c", MAPPED_YET, "sh", *argv],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, cwd=cwd, user=user.uid, group=user.gid, extra_groups=list(groups),
        start_new_session=True,
    )  # fmt: skip

    def unshared() -> bool:
        with contextlib.suppress(OSError):
            return os.stat(f"/proc/{proc.pid}/ns/user").st_ino != own
        return proc.poll() is not None

    try:
        assert wait_for(unshared, WAIT) and proc.poll() is None, proc.communicate()
        where = Path(f"/proc/{proc.pid}")
        if deny_setgroups:
            (where / "setgroups").write_text("deny")
        (where / "gid_map").write_text(f"0 {user.gid} 1\n1 {SUB} {RANGE}\n")
        (where / "uid_map").write_text(f"0 {user.uid} 1\n1 {SUB} {RANGE}\n")
        out, err = proc.communicate(input, timeout=WAIT)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.communicate()
    return Run([str(a) for a in argv], proc.returncode, out, err)


@dataclass
class Ranged:
    """The test user's root ``box/st`` with agent ``ci`` (the namespace's ``nobody``: uid
    65534 inside, 165533 outside), allowed ``shell.exec`` by both policies, made inside a
    namespace with subordinate ids; ``out`` a directory any uid may write."""

    user: UnprivilegedUser
    box: Path
    out: Path

    @property
    def storage(self) -> Path:
        return self.box / "st"

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def ctx(self, *args: str, input: str = "", **kw) -> Run:
        env = user_env(self.box, CTX_STORAGE=str(self.storage))
        run = in_mapped_namespace([*CTX_ARGV, *args], self.user, env=env, cwd=self.box,
                                  input=input, **kw)  # fmt: skip
        run.argv = list(args)
        return run

    def grant_network(self) -> None:
        with open(self.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} network:default connect\n")


@pytest.fixture
def ranged(user: UnprivilegedUser, box: Path) -> Iterator[Ranged]:
    taken = [entry.pw_name for entry in pwd.getpwall() if SUB <= entry.pw_uid < SUB + RANGE]
    if taken:
        pytest.skip(f"users {taken} have ids of the subordinate range {SUB}…")
    out = Path(new_scratch_dir(SCRATCH, "o"))
    out.chmod(0o1777)
    world = Ranged(user, box, out)
    try:
        for args in (("bootstrap",), ("queue", "init", "--project", "proj")):
            made = world.ctx(*args)
            assert made.rc == 0, made
        req = {"name": AGENT, "label": LABEL, "tools": ["shell.exec"]}
        made = world.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        assert made.rc == 0 and made.json()["identity"]["uid"] == NOBODY_INSIDE, made
        with open(world.storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:shell.exec execute\n")
        yield world
    finally:
        kill_processes_of(world.storage)
        shutil.rmtree(out, ignore_errors=True)


# ============================================================================== bootstrap


def test_bootstrap_in_a_directory_of_an_unmapped_owner_names_the_namespace(
    rootless: Rootless, member
) -> None:
    """R-5, README (each refusal says what to do): a directory of another user (0755), whose
    uid the namespace does not map, cannot be written by the namespace's uid 0 whatever its
    capabilities.  ``ctx bootstrap --storage`` there is EACCES, exit 1, and makes nothing;
    the reason must be the unmapped owner, not advice to run as root (the caller is uid 0)."""
    who, gid = member
    theirs = new_scratch_dir(SCRATCH, "m")
    try:
        os.chown(theirs, who.uid, gid)
        run = rootless.ctx("bootstrap", "--storage", str(theirs))
        refused(run, "EACCES")
        assert os.listdir(theirs) == []
        assert "as root" not in run.err, run
        assert names_the_namespace(run.err), run
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


# ============================================================================== shared spaces


def test_shared_create_with_an_unmapped_group_leaves_no_half_made_space(
    rootless: Rootless, member
) -> None:
    """X-1, ``ctx shared create --help`` (the space's directories belong to the group): uid 0
    of the namespace holds CAP_CHOWN, yet cannot give a directory group ``ctxrl-g``, which the
    namespace does not map (chown is EINVAL).  The command must say so (EINVAL, the gid, the
    namespace), exit 1, and leave shared/ as it was: a space made and left with the wrong group
    would be kept so by every later run."""
    _, gid = member
    before = snapshot(rootless.storage / "shared")
    run = rootless.ctx("shared", "create", SPACE, "--group", GROUP)
    refused(run, "EINVAL")
    assert str(gid) in run.err and names_the_namespace(run.err), run
    assert snapshot(rootless.storage / "shared") == before
    assert not (rootless.storage / "shared" / SPACE).exists()


# ========================================================================= agents of other uids


@pytest.mark.parametrize("command", ["run", "work"])
def test_calls_for_an_agent_of_an_unmapped_uid_refuse_and_leave_its_home_unmade(
    rootless: Rootless, member, command: str
) -> None:
    """A-3, P-5 step 1, T-5, W-1, R-4, docs/sessions.md (``home/<uid>/`` is the agent's):
    ``ctx agent create --user ctxrl-m`` in the namespace records that user's ids; no process
    there can take them.  ``ctx run --agent`` is refused (exit 126) and ``ctx queue work``
    stops before its first claim (exit 1, "no job was claimed"), both EINVAL naming the uid
    and the namespace, with nothing run and the job pending.  A refusal makes nothing: the
    agent's home is not created, owned by the namespace's uid 0 (the user outside), for a
    later run by the machine's root to keep."""
    who, _ = member
    made = create_agent(rootless, "far", "--user", MEMBER)
    assert made["identity"]["uid"] == who.uid, made
    queue = QueueCLI(rootless.storage, "proj")
    assert rootless.ctx("queue", "init", "--project", "proj").rc == 0
    trace = rootless.box / "ran"
    job = queue.publish(shell_job(f"touch {trace}"))
    home = rootless.storage / "home"
    before = snapshot(home)
    if command == "run":
        run = rootless.ctx("run", "--agent", "far", "shell.exec",
                           input=json.dumps({"cmd": f"touch {trace}"}))  # fmt: skip
        refused(run, "EINVAL", rc=126)
    else:
        run = rootless.ctx("queue", "work", "--project", "proj", "--agent", "far", "--drain")
        refused(run, "EINVAL")
        assert "no job was claimed" in run.err, run
    assert f"uid {who.uid}" in run.err and names_the_namespace(run.err), run
    assert not trace.exists() and queue.state(job) == "pending"
    assert snapshot(home) == before, sorted(snapshot(home))


def test_agent_start_in_the_namespace_names_the_namespace_and_leaves_no_terminal(
    rootless: Rootless, member
) -> None:
    """A-1, A-2, P-5 step 1: an agent whose uid the namespace does not map has no terminal
    there.  In a container with a /run of its own (a tmpfs) ``ctx agent start`` is EINVAL
    naming the namespace; with the machine's /run, whose /run/cortexfs/terminal is root's
    (shown as 65534), the refusal must also be about the namespace: that directory is not
    another user's to remove.  Either way: exit 1, no process left."""
    create_agent(rootless, "far", "--user", MEMBER)
    session = f"s{uuid.uuid4().hex[:8]}"
    start = f'"$CTX" agent start far --session {session} --no-workspace'
    own_run = rootless.sh(f"mount -t tmpfs tmpfs /run || exit 97\n{start}", "--mount",
                          "--propagation", "private")  # fmt: skip
    refused(own_run, "EINVAL")
    assert names_the_namespace(own_run.err), own_run
    assert wait_for(lambda: processes_of(rootless.storage) == [], WAIT)

    if not RUN_BASE.is_dir():
        RUN_BASE.mkdir(mode=0o711, parents=True)  # what a root's terminal leaves in place
    machines_run = rootless.sh(start)
    assert wait_for(lambda: processes_of(rootless.storage) == [], WAIT)
    assert machines_run.rc == 1 and TRACEBACK not in machines_run.err, machines_run
    assert RUN_BASE.stat().st_uid == 0
    assert "have root remove" not in machines_run.err, machines_run
    assert names_the_namespace(machines_run.err), machines_run


# ============================================================================== subordinate ids


def test_a_tool_in_a_namespace_with_subordinate_ids_runs_as_the_agents_mapped_ids_only(
    ranged: Ranged, member
) -> None:
    """T-5, P-5 step 1, W-1, I-1: with subordinate ids mapped, the agent's uid exists in the
    namespace and its tool runs: as uid and gid 65534 inside (165533 outside), the agent's
    groups only, no capability at all.  A file of an outside user, shown as 65534 like the
    agent, stays closed to it (the kernel judges the real ids).  A worker there runs a job
    once, to done."""
    who, gid = member
    ranged.grant_network()  # no namespace of its own: uid 0 here cannot setns back out of one
    secret = ranged.out / "theirs"
    secret.write_text("not for the agent\n")
    os.chown(secret, who.uid, gid)
    secret.chmod(0o600)
    status, leak = ranged.out / "status", ranged.out / "leak"
    cmd = f"cat /proc/self/status > {status}; cat {secret} > {leak} 2>&1; true"
    run = ranged.ctx("run", "--agent", AGENT, "shell.exec", input=json.dumps({"cmd": cmd}))
    assert run.rc == 0 and TRACEBACK not in run.err, run
    assert (status.stat().st_uid, status.stat().st_gid) == (NOBODY_OUTSIDE, NOBODY_OUTSIDE)
    fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
    assert fields["Uid"].split() == [str(NOBODY_INSIDE)] * 4, fields["Uid"]
    assert fields["Gid"].split() == [str(NOBODY_INSIDE)] * 4, fields["Gid"]
    assert fields["Groups"].split() == [str(NOBODY_INSIDE)], fields["Groups"]
    for kind in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[kind], 16) == 0, (kind, fields[kind])
    assert "not for the agent" not in leak.read_text()

    trace = ranged.out / "job"
    job = ranged.queue.publish(shell_job(f"echo once >> {trace}"))
    work = ranged.ctx("queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
    assert work.rc == 0, work
    assert trace.read_text().split() == ["once"]
    assert trace.stat().st_uid == NOBODY_OUTSIDE
    assert ranged.queue.only_result(job)[0] == "done"
    ranged.queue.assert_settled()


def test_without_a_network_grant_a_namespaces_root_refuses_before_anything_runs(
    ranged: Ranged,
) -> None:
    """P-4, P-5, W-1, docs/workers.md (a refusal every job would meet: nothing claimed): the
    agent may not use the network, so its tool must start in a network namespace of its own;
    this namespace's uid 0 cannot return from one to its parent's network.  ``ctx run`` is
    EACCES naming the network rule (exit 126) and runs nothing; the worker claims nothing,
    says so, and the job stays pending."""
    trace = ranged.out / "ran"
    run = ranged.ctx("run", "--agent", AGENT, "shell.exec",
                     input=json.dumps({"cmd": f"touch {trace}"}))  # fmt: skip
    refused(run, "EACCES", rc=126)
    assert "network:default" in run.err, run
    job = ranged.queue.publish(shell_job(f"touch {trace}"))
    before = snapshot(ranged.queue.dir)
    work = ranged.ctx("queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
    refused(work, "EACCES")
    assert "no job was claimed" in work.err, work
    assert snapshot(ranged.queue.dir) == before and ranged.queue.state(job) == "pending"
    assert not trace.exists()


def test_run_where_setgroups_is_denied_names_the_cause(ranged: Ranged, member) -> None:
    """P-5 step 1, T-5: where the namespace denies setgroups, the supplementary groups the
    creator brought in (an outside group, shown as 65534) cannot be dropped, so the tool
    cannot run with the agent's groups alone.  It must not run (EPERM, exit 126), and the
    refusal must say why: setgroups is denied in this user namespace."""
    _, gid = member
    ranged.grant_network()
    trace = ranged.out / "ran"
    run = ranged.ctx("run", "--agent", AGENT, "shell.exec",
                     input=json.dumps({"cmd": f"id > {trace}"}), deny_setgroups=True,
                     groups=[gid])  # fmt: skip
    refused(run, "EPERM", rc=126)
    assert not trace.exists()
    assert "setgroups" in run.err, run


def test_a_worker_where_setgroups_is_denied_claims_nothing(ranged: Ranged, member) -> None:
    """W-1, I-1, docs/workers.md (what every job would meet is not the job's failure; compare
    a root without CAP_SETUID): no job's tool can start with the agent's groups here.  The
    worker must stop before its first claim, EPERM, exit 1, with every job still pending."""
    _, gid = member
    ranged.grant_network()
    trace = ranged.out / "ran"
    jobs = [ranged.queue.publish(shell_job(f"touch {trace}{n}")) for n in range(2)]
    work = ranged.ctx("queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
                      deny_setgroups=True, groups=[gid])  # fmt: skip
    assert TRACEBACK not in work.err, work
    assert list(ranged.out.iterdir()) == []
    assert [ranged.queue.state(job) for job in jobs] == ["pending", "pending"], work
    refused(work, "EPERM")


# ============================================================================== leases from outside


@dataclass
class Den:
    storage: Path
    queue: QueueCLI
    member: UnprivilegedUser
    gid: int
    home: Path

    def inside(self, *args: str, pid_namespace: bool = False) -> Run:
        """``ctx queue ARGS --project den`` as the member, uid 0 of ``unshare -r`` (with a pid
        namespace and /proc of its own when ``pid_namespace``), its group kept."""
        extra = ["--pid", "--fork", "--mount-proc"] if pid_namespace else []
        argv = ["unshare", "--user", "--map-root-user", *extra, *CTX_ARGV, "queue", *args,
                "--project", SPACE]  # fmt: skip
        env = user_env(self.home, CTX_STORAGE=str(self.storage))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT,
                              cwd="/", user=self.member.uid, group=self.member.gid,
                              extra_groups=[self.gid])  # fmt: skip
        return as_run(args, done)


@pytest.fixture
def den(searchable_storage: Path, member) -> Iterator[Den]:
    who, gid = member
    reason = _userns_refusal(who)
    if reason is not None:
        pytest.skip(f"{who.name} cannot make a user namespace here: {reason}")
    made = ctx_run("shared", "create", SPACE, "--group", GROUP,
                   env=clean_env(CTX_STORAGE=str(searchable_storage)))  # fmt: skip
    assert made.rc == 0, made
    home = new_scratch_dir(SCRATCH, "h")
    os.chown(home, who.uid, who.gid)
    try:
        yield Den(searchable_storage, QueueCLI(searchable_storage, SPACE), who, gid, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def holders(count: int) -> Iterator[list[subprocess.Popen]]:
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def report_of(run: Run) -> dict:
    assert run.rc in (0, 1) and TRACEBACK not in run.err, run
    return run.json()


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def test_a_namespaces_root_judges_the_machine_roots_holders_it_sees_as_65534(den: Den) -> None:
    """Q-3, Q-5, I-4: root claims two jobs of the space for two of its processes (--ttl 600);
    one ends.  A member, uid 0 of ``unshare -r`` in the same pid namespace, sees root's
    processes with the overflow uid and may not signal them.  Its ``show`` calls the live
    holder alive; its recover leaves that job claimed and requeues the other at once."""
    q = den.queue
    live, ended = q.publish(name="live"), q.publish(name="ended")
    with holders(2) as (kept, gone):
        assert q.claim("--pid", str(kept.pid), "--ttl", "600") == live
        assert q.claim("--pid", str(gone.pid), "--ttl", "600") == ended
        gone.kill()
        gone.wait()
        shown = den.inside("show", live, "--json")
        assert shown.rc == 0 and shown.json()["holder"]["state"] == "alive", shown
        report = report_of(den.inside("recover", "--json"))
        assert report["consistent"] is True and report["errors"] == [], report
        assert jobs_in(report, "requeued") == [ended], report
        assert jobs_in(report, "untouched") == [live], report
        assert q.state(live) == "claimed" and q.state(ended) == "pending"
        assert os.stat(q.dir / "pending" / ended).st_gid == den.gid


def test_a_rootless_container_with_its_own_pids_never_takes_a_pid_as_proof(den: Den) -> None:
    """Q-5 (a pid alone is never proof across pid namespaces; the same host with another boot
    is; so is an expired lease), Q-6: leases the machine's root wrote for a process that has
    exited (--ttl 600), for one whose lease expired, and for one of another boot of this host.
    A rootless container (``unshare -r --pid --fork --mount-proc``) leaves the first claimed,
    saying its holder is outside this pid namespace, and requeues the two others."""
    q = den.queue
    names = {"exited": q.publish(name="exited"), "expired": q.publish(name="expired"),
             "rebooted": q.publish(name="rebooted")}  # fmt: skip
    with holders(3) as procs:
        for proc, job in zip(procs, names.values(), strict=True):
            assert q.claim("--pid", str(proc.pid), "--ttl", "600") == job
        for proc in procs:
            proc.kill()
            proc.wait()
    lease = q.lease(names["expired"])
    q.write_lease(names["expired"], {**lease, "expires_at": "2020-01-01T00:00:00Z"})
    lease = q.lease(names["rebooted"])
    q.write_lease(names["rebooted"], {**lease, "boot_id": str(uuid.uuid4())})
    report = report_of(den.inside("recover", "--json", pid_namespace=True))
    assert report["consistent"] is True and report["errors"] == [], report
    assert jobs_in(report, "requeued") == sorted([names["expired"], names["rebooted"]]), report
    assert jobs_in(report, "untouched") == [names["exited"]], report
    assert "outside this pid namespace" in report["untouched"][0]["detail"], report
    assert q.state(names["exited"]) == "claimed"
    assert {q.state(names[k]) for k in ("expired", "rebooted")} == {"pending"}
