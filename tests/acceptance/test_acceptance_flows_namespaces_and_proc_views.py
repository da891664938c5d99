"""Processes that see different views of one machine (SPEC Q-3, Q-5, Q-6, I-4, W-1, A-1, A-2,
T-4, T-5, F-1, R-1): shell claims and workers in new pid namespaces, judged from a sibling
namespace, from inside their own, and from inside one that has no ``/proc`` of its own; a
``/proc`` mounted with ``hidepid=`` in a private mount namespace, through which a non-root
member of a space looks at root's holders; UTS namespaces with other host names; user
namespaces whose uid 0 is not the machine's root; mounts made in a private mount namespace;
``/ctx`` mounted differently in a sandbox; and agent terminals started inside a pid namespace.

Each kind of namespace is tried first; a test needing one this machine cannot make is skipped
with the reason.  Everything goes through the installed ``ctx``."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import coder_host
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser, members_of
from tests.support.users import unprivileged_user as unprivileged_user

CTX = shlex.quote(CTX_ARGV[0])
SCRATCH = scratch_top(__file__)
HOST_PID_NS = os.stat("/proc/self/ns/pid").st_ino
SPACE, GROUP, MEMBER = "den", "ctxpv-g", "ctxpv-m"
WAIT = 40.0  # seconds: the bound of every wait for another process (a hang reaches it)

# ------------------------------------------------------------------------------ what works here


def _probe(argv: list[str], user: UnprivilegedUser | None = None) -> str | None:
    """None when ``argv`` (as ``user``) exits 0; else why not, in words."""
    if shutil.which(argv[0]) is None:
        return f"{argv[0]} is not installed"
    kw = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, **kw)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(argv)}: {exc}"
    if done.returncode != 0:
        return f"{' '.join(argv)} fails here: {done.stderr.strip() or done.returncode}"
    return None


@functools.cache
def why_not(kind: str) -> str | None:
    """Why this machine cannot make a namespace of ``kind`` for these tests, or None."""
    if os.geteuid() != 0:
        return "needs root to create namespaces and act as other users"
    probes = {
        "pid": ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        "uts": ["unshare", "--uts", "hostname", "probe"],
        "hidepid": ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    "mount -t proc -o hidepid=2 proc /proc && grep -q hidepid= "
                    "/proc/self/mountinfo"],
        "userns": ["unshare", "--map-root-user", "true"],
        "bwrap": ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "true"],
        "setpriv": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"],
        "fuse": ["test", "-c", "/dev/fuse"],
    }  # fmt: skip
    return _probe(probes[kind])


def need(*kinds: str) -> None:
    for kind in kinds:
        reason = why_not(kind)
        if reason is not None:
            pytest.skip(f"{kind} namespaces/tools unavailable: {reason}")


def need_userns_for(user: UnprivilegedUser) -> None:
    need("userns")
    reason = _probe(["unshare", "--map-root-user", "true"], user)
    if reason is not None:
        pytest.skip(f"{user.name} cannot make a user namespace here: {reason}")


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def box() -> Iterator[Path]:
    """A scratch directory (0755) for the scripts and the files they leave."""
    made = new_scratch_dir(SCRATCH, "b")
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts, each in a process group of its own: killed with their group at
    teardown (a pid namespace dies with its init)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        end_group(proc)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=30)


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group ``proc`` leads, while it is unreaped (so that the group id
    is still its own)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def spawn(procs: list, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kw)  # fmt: skip
    procs.append(proc)
    return proc


def script(box: Path, name: str, text: str) -> str:
    """``text`` saved as ``box/name``; its path."""
    path = box / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def wait_file(path: Path, proc: subprocess.Popen | None = None, *, line: bool = True) -> str:
    """The content of ``path`` once written (fails early when ``proc`` ended without it): its
    whole line with ``line`` (``echo $? > F`` makes F empty before it writes), else as soon as
    it is there (a ``touch`` marker)."""

    def written() -> bool:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return False
        return not line or text.endswith("\n")

    ok = wait_for(lambda: written() or (proc is not None and proc.poll() is not None), WAIT)
    if not path.exists():
        said = ""
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            said = f"exit {proc.returncode}: {out} {err}"
        pytest.fail(f"{path.name} never written (waited: {ok}) {said}")
    return path.read_text().strip()


def recover_json(r: Run | subprocess.CompletedProcess) -> tuple[int, dict]:
    rc = r.rc if isinstance(r, Run) else r.returncode
    out = r.out if isinstance(r, Run) else r.stdout
    err = r.err if isinstance(r, Run) else r.stderr
    assert rc in (0, 1) and "Traceback" not in err, (rc, out, err)
    return rc, json.loads(out)


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def new_pid_ns(how: str) -> list[str]:
    """The argv prefix of a fresh pid namespace: ``unshare`` or ``bwrap``, each with a /proc of
    its own; ``unshare-host-proc`` and ``bwrap-host-proc`` keep the machine's /proc."""
    return {
        "unshare": ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
        "unshare-host-proc": ["unshare", "--pid", "--fork", "--kill-child"],
        "bwrap": ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc",
                  "--die-with-parent"],
        "bwrap-host-proc": ["bwrap", "--dev-bind", "/", "/", "--unshare-pid",
                            "--die-with-parent"],
    }[how]  # fmt: skip


def sibling() -> list[str]:
    """A pid namespace beside the test's others: bubblewrap's when it is installed."""
    return new_pid_ns("bwrap" if why_not("bwrap") is None else "unshare")


def in_sibling(queue: QueueCLI, *args: str) -> subprocess.CompletedProcess:
    """``ctx queue ARGS`` run by a shell in a new pid namespace (its own /proc), so that a claim
    has a live caller there; exits with ctx."""
    argv = [*CTX_ARGV, "queue", *args]
    return subprocess.run([*sibling(), "sh", "-c", '"$@"; exit $?', "sh", *argv],
                          env=queue_env(queue), capture_output=True, text=True,
                          timeout=WAIT)  # fmt: skip


def queue_env(queue: QueueCLI) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(queue.storage))


def free_host_pids(count: int) -> int:
    """The first of ``count`` consecutive pid numbers no process has on the host now, from the
    top of pid_max down."""
    top = min(int(Path("/proc/sys/kernel/pid_max").read_text()), 4_194_304)
    run = 0
    for pid in range(top - 10, 1000, -1):
        run = run + 1 if not os.path.exists(f"/proc/{pid}") else 0
        if run == count:
            return pid
    pytest.skip(f"no {count} free pid numbers on this host")


def process_at(pid: int, argv: list[str]) -> subprocess.Popen | None:
    """``argv`` started on the host as pid ``pid`` (ns_last_pid set just before the fork);
    None when another fork took that number first, five times over."""
    for _ in range(5):
        if os.path.exists(f"/proc/{pid}"):
            return None
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(argv, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


# ------------------------------------------------------------------------------ a shared space


@dataclass
class Den:
    """Space ``den`` of group ``ctxpv-g`` in a root every uid may search, with its queue, and
    ``member``, a non-root member of that group."""

    storage: Path
    queue: QueueCLI
    member: UnprivilegedUser
    gid: int
    cache: Path

    def member_env(self) -> dict[str, str]:
        env = {k: v for k, v in queue_env(self.queue).items() if not k.startswith("XDG_")}
        env.update(HOME="/nonexistent", XDG_CACHE_HOME=str(self.cache))
        return env

    def as_member(self, argv: list[str], hidepid: str | None = None) -> subprocess.CompletedProcess:
        """``argv`` as the member (its group only); with ``hidepid``, in a private mount
        namespace whose /proc is mounted with ``hidepid=HIDEPID``."""
        drop = ["setpriv", f"--reuid={self.member.uid}", f"--regid={self.member.gid}",
                f"--groups={self.gid}", "--"]  # fmt: skip
        if hidepid is None:
            command = [*drop, *argv]
        else:
            inner = (f"mount -t proc -o hidepid={hidepid} proc /proc || exit 97\n"
                     'exec "$@"')  # fmt: skip
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner,
                       "sh", *drop, *argv]  # fmt: skip
        return subprocess.run(command, env=self.member_env(), capture_output=True, text=True,
                              timeout=WAIT, cwd="/")  # fmt: skip

    def member_ctx(self, *args: str, hidepid: str | None = None) -> subprocess.CompletedProcess:
        return self.as_member([*CTX_ARGV, "queue", *args, "--project", SPACE], hidepid)


@pytest.fixture
def den(storage: Path) -> Iterator[Den]:
    need("setpriv")
    (member,), gid = members_of(GROUP, MEMBER)
    made = ctx_run(
        "shared", "create", SPACE, "--group", GROUP, env=clean_env(CTX_STORAGE=str(storage))
    )
    assert made.rc == 0, made
    cache = new_scratch_dir(SCRATCH, "cache")
    os.chown(cache, member.uid, member.gid)
    yield Den(storage, QueueCLI(storage, SPACE), member, gid, cache)
    shutil.rmtree(cache, ignore_errors=True)


@contextlib.contextmanager
def sleeper() -> Iterator[subprocess.Popen]:
    """A live root process to stand as a lease holder."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# ============================================================================== pid namespaces


def test_a_sibling_pid_namespace_leaves_a_live_shell_claim_alone_until_its_holder_finishes(
    queue, procs, box
):
    """Q-5, Q-6, I-4: a shell in pid namespace A claims a job (--ttl 60).  From a sibling
    namespace B (bubblewrap's when installed) plain recover and --reconcile --grace 0 leave it
    untouched (exit 0, consistent) saying the holder is outside the namespace; `show` calls
    the holder unknown; `claim` finds nothing (exit 3).  The parent namespace leaves it alone
    too.  The holder then finishes it in A: one result, naming A's namespace, and the queue
    settled."""
    need("pid")
    job = queue.publish(name="held")
    b = shlex.quote(str(box))
    inner = script(box, "holder.sh", (
        f"echo $$ > {b}/pid; stat -L -c %i /proc/self/ns/pid > {b}/ns\n"
        f"{CTX} queue claim --project proj --ttl 60 > {b}/job.tmp; echo $? > {b}/claim.rc\n"
        f"mv {b}/job.tmp {b}/job\n"
        f"until [ -e {b}/go ]; do sleep 0.05; done\n"
        f"echo '{{\"by\": \"a\"}}' | {CTX} queue finish --project proj \"$(cat {b}/job)\" --ok - "
        f"> {b}/fin.out 2>&1; echo $? > {b}/fin.rc\n"
    ))  # fmt: skip
    ns = spawn(procs, [*new_pid_ns("unshare"), "sh", "-c", f"sh {inner}; sleep 30"],
               queue_env(queue))  # fmt: skip
    assert wait_file(box / "job", ns) == job
    assert (box / "claim.rc").read_text().strip() == "0"
    a_ns = int((box / "ns").read_text())
    lease = queue.lease(job)
    assert int(lease["pid_ns"]) == a_ns != HOST_PID_NS, lease
    assert lease["pid"] == int((box / "pid").read_text()), lease

    for args in ((), ("--reconcile", "--grace", "0")):
        rc, report = recover_json(
            in_sibling(queue, "recover", "--project", "proj", *args, "--json")
        )
        assert rc == 0 and report["consistent"] is True, (args, report)
        assert report["requeued"] == [] and jobs_in(report, "untouched") == [job], report
        assert "outside this pid namespace" in report["untouched"][0]["detail"], report
    shown = in_sibling(queue, "show", "--project", "proj", job, "--json")
    assert shown.returncode == 0, shown
    assert json.loads(shown.stdout)["holder"]["state"] == "unknown", shown.stdout
    took = in_sibling(queue, "claim", "--project", "proj")
    assert (took.returncode, took.stdout) == (3, ""), took
    rc, report = recover_json(queue.run("recover", "--json"))  # the parent namespace
    assert rc == 0 and report["requeued"] == [] and jobs_in(report, "untouched") == [job]
    assert queue.state(job) == "claimed"

    (box / "go").touch()
    assert wait_file(box / "fin.rc", ns) == "0", (box / "fin.out").read_text()
    state, res = queue.only_result(job)
    assert state == "done" and res["output"] == {"by": "a"}, res
    assert int(res["worker"]["pid_ns"]) == a_ns, res
    queue.assert_settled()


def test_inside_its_own_pid_namespace_recover_requeues_a_dead_holder_at_once_and_keeps_a_live_one(
    queue, procs, box
):
    """Q-5 (same boot and pid namespace: the pid is proof): in namespace A, one shell claims
    and ends, another claims and lives on (both --ttl 600).  From the parent namespace recover
    can judge neither and leaves both; recover run inside A requeues the dead holder's job at
    once and leaves the live one, which `show` in A calls alive."""
    need("pid")
    dead, live = queue.publish(name="dead"), queue.publish(name="live")
    b = shlex.quote(str(box))
    living = script(box, "live.sh", (
        f"{CTX} queue claim --project proj --ttl 600 > {b}/live.tmp; mv {b}/live.tmp {b}/live\n"
        "exec sleep 300\n"
    ))  # fmt: skip
    outer = script(box, "a.sh", (
        f"sh -c '{CTX} queue claim --project proj --ttl 600 > {b}/dead; true'\n"
        f"sh {living} &\n"
        f"until [ -e {b}/go ]; do sleep 0.05; done\n"
        f"{CTX} queue recover --project proj --json > {b}/r.json; echo $? > {b}/r.rc\n"
        f"{CTX} queue show --project proj \"$(cat {b}/live)\" --json > {b}/show.json\n"
        f"touch {b}/done; sleep 30\n"
    ))  # fmt: skip
    ns = spawn(procs, [*new_pid_ns("unshare"), "sh", outer], queue_env(queue))
    assert wait_file(box / "live", ns) == live
    assert (box / "dead").read_text().strip() == dead

    rc, report = recover_json(queue.run("recover", "--json"))
    assert rc == 0 and report["requeued"] == [], report
    assert jobs_in(report, "untouched") == sorted([dead, live]), report

    (box / "go").touch()
    wait_file(box / "done", ns, line=False)
    assert (box / "r.rc").read_text().strip() == "0"
    report = json.loads((box / "r.json").read_text())
    assert jobs_in(report, "requeued") == [dead], report
    assert jobs_in(report, "untouched") == [live], report
    assert json.loads((box / "show.json").read_text())["holder"]["state"] == "alive"
    assert queue.state(dead) == "pending" and queue.state(live) == "claimed"


@pytest.mark.parametrize("how", ["unshare-host-proc", "bwrap-host-proc"])
def test_recover_in_a_pid_namespace_without_a_proc_of_its_own_never_requeues_a_live_holder(
    queue, procs, box, how
):
    """Q-3, Q-5 ("a pid alone is never proof across ... pid namespaces"), I-4: a pid namespace
    made without its own /proc (``unshare --pid --fork`` without ``--mount-proc``, bubblewrap
    without ``--proc``) sees the host's process table.  A shell there claims a job with
    --ttl 600 under the pid number that a host process has; that host process exits.  The
    holder still runs, so recover run inside the same namespace must leave the job claimed."""
    need("bwrap" if how.startswith("bwrap") else "pid")
    job = queue.publish(name="unseen")
    decoy = subprocess.Popen(["sleep", "120"])
    try:
        b = shlex.quote(str(box))
        holder = script(box, "holder.sh", (
            f"echo $$ > {b}/pid\n"
            f"{CTX} queue claim --project proj --ttl 600 > {b}/job.tmp; mv {b}/job.tmp {b}/job\n"
            "exec sleep 300\n"
        ))  # fmt: skip
        outer = script(box, "ns.sh", (
            f"echo {decoy.pid - 1} > /proc/sys/kernel/ns_last_pid || exit 98\n"
            f"sh {holder} &\n"
            f"until [ -e {b}/go ]; do sleep 0.05; done\n"
            f"{CTX} queue recover --project proj --json > {b}/r.json; echo $? > {b}/r.rc\n"
            "sleep 30\n"
        ))  # fmt: skip
        ns = spawn(procs, [*new_pid_ns(how), "sh", outer], queue_env(queue))
        assert wait_file(box / "job", ns) == job
        if int((box / "pid").read_text()) != decoy.pid:
            pytest.skip("the holder did not get the host process's pid number")
        lease = queue.lease(job)
        assert lease["pid"] == decoy.pid and int(lease["pid_ns"]) != HOST_PID_NS, lease
    finally:
        decoy.kill()
        decoy.wait()
    (box / "go").touch()
    assert wait_file(box / "r.rc", ns) == "0"
    report = json.loads((box / "r.json").read_text())
    assert ns.poll() is None  # the namespace, and the holder in it, still run
    assert report["requeued"] == [] and jobs_in(report, "untouched") == [job], report
    assert queue.state(job) == "claimed"


# ============================================================================== hidepid


@pytest.mark.parametrize("hidepid", ["2", "invisible"])
def test_a_member_behind_hidepid_never_requeues_roots_live_claim(den: Den, hidepid):
    """Q-5, Q-6 (a holder that cannot be judged is left alone), I-4: root claims a job of the
    space for a live root process (--ttl 600).  A non-root member whose /proc hides other
    users' processes (``hidepid=2``, ``hidepid=invisible``) cannot see that holder.  Its
    `show` must not call the holder gone, and its recover must leave the job claimed."""
    need("hidepid")
    q = den.queue
    job = q.publish(name="roots")
    with sleeper() as holder:
        assert q.claim("--pid", str(holder.pid), "--ttl", "600") == job
        shown = den.member_ctx("show", job, "--json", hidepid=hidepid)
        assert shown.returncode == 0, shown
        assert json.loads(shown.stdout)["holder"]["state"] != "gone", shown.stdout
        rc, report = recover_json(den.member_ctx("recover", "--json", hidepid=hidepid))
        assert alive(holder.pid)
        assert rc == 0 and report["requeued"] == [], report
        assert jobs_in(report, "untouched") == [job], report
        assert q.state(job) == "claimed"


def test_a_member_behind_hidepid_leaves_the_job_of_roots_running_worker_alone(
    den: Den, outbox, procs
):
    """Q-5, I-4, W-3: root's worker (agent ci) runs a job of the space that waits for a
    signal.  A member whose /proc is mounted ``hidepid=2`` runs recover and then claims: the
    job must stay with the worker (nothing requeued, claim exit 3), and once signalled the
    worker finishes it, run once, with one result."""
    need("hidepid")
    q = den.queue
    make_agent(den.storage, ["shell.exec"])
    allow_in_tool_policy(den.storage, "shell.exec")
    runs, go = outbox / "runs", outbox / "go"
    job = q.publish(shell_job(f"echo run >> {runs}; until [ -e {go} ]; do sleep 0.05; done; "
                              "echo fine"), name="running")  # fmt: skip
    argv = [*CTX_ARGV, "queue", "work", "--project", SPACE, "--agent", AGENT, "--drain"]
    worker = spawn(procs, argv, queue_env(q))
    try:
        assert wait_for(runs.exists, WAIT), worker.poll()
        assert q.lease(job)["pid"] == worker.pid
        rc, report = recover_json(den.member_ctx("recover", "--json", hidepid="2"))
        assert rc == 0 and report["requeued"] == [], report
        assert jobs_in(report, "untouched") == [job], report
        took = den.member_ctx("claim", "--ttl", "60", hidepid="2")
        assert (took.returncode, took.stdout) == (3, ""), took
    finally:
        go.touch()
    _out, err = worker.communicate(timeout=WAIT)
    assert worker.returncode == 0, err
    assert runs.read_text().split() == ["run"]
    state, res = q.only_result(job)
    assert state == "done" and "fine" in json.dumps(res["output"]), res


def test_a_member_behind_hidepid_noaccess_keeps_roots_live_holder_and_requeues_its_dead_one(
    den: Den,
):
    """Q-5: with /proc mounted ``hidepid=1`` (noaccess) a member sees that root's holder
    exists but may not read it: recover leaves that job alone, saying the holder cannot be
    inspected, and `show` calls it alive; the job of a root holder that has exited (and been
    reaped) is requeued at once."""
    need("hidepid")
    q = den.queue
    kept, freed = q.publish(name="kept"), q.publish(name="freed")
    with sleeper() as live, sleeper() as ending:
        assert q.claim("--pid", str(live.pid), "--ttl", "600") == kept
        assert q.claim("--pid", str(ending.pid), "--ttl", "600") == freed
        ending.kill()
        ending.wait()
        shown = den.member_ctx("show", kept, "--json", hidepid="1")
        assert shown.returncode == 0, shown
        assert json.loads(shown.stdout)["holder"]["state"] == "alive", shown.stdout
        rc, report = recover_json(den.member_ctx("recover", "--json", hidepid="1"))
        assert rc == 0 and report["consistent"] is True, report
        assert jobs_in(report, "requeued") == [freed], report
        assert jobs_in(report, "untouched") == [kept], report
        assert "cannot be inspected" in report["untouched"][0]["detail"], report
        assert q.state(kept) == "claimed" and q.state(freed) == "pending"


def test_a_member_behind_hidepid_judges_its_own_holders(den: Den):
    """Q-3, Q-5: behind ``hidepid=2`` a member still sees its own processes: it claims two
    jobs for two of its processes (--ttl 600); one ends; its recover requeues that job at once
    and leaves the other, whose lease records the live process's start time."""
    need("hidepid")
    q = den.queue
    first, second = q.publish(name="mine-live"), q.publish(name="mine-ended")
    member = den.member
    holders = [subprocess.Popen(["sleep", "300"], user=member.uid, group=member.gid,
                                extra_groups=[den.gid]) for _ in range(2)]  # fmt: skip
    try:
        for proc, job in zip(holders, (first, second), strict=True):
            took = den.member_ctx("claim", "--pid", str(proc.pid), "--ttl", "600", hidepid="2")
            assert (took.returncode, took.stdout.strip()) == (0, job), took
            assert q.lease(job)["create_time"], q.lease(job)
        holders[1].kill()
        holders[1].wait()
        rc, report = recover_json(den.member_ctx("recover", "--json", hidepid="2"))
        assert rc == 0 and jobs_in(report, "requeued") == [second], report
        assert jobs_in(report, "untouched") == [first], report
        assert q.state(first) == "claimed" and q.state(second) == "pending"
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()


# ============================================================================== UTS namespaces


def test_a_holder_under_another_host_name_in_the_same_pid_namespace_is_judged_by_its_pid(
    queue, procs, box, child
):
    """Q-3, Q-5 (same boot and pid namespace: the pid decides, whatever the host name): a shell
    in a UTS namespace named "elsewhere" claims a job (--ttl 600), and the host claims another
    for a host process.  Recover on the host leaves the live "elsewhere" holder alone, recover
    under the name "elsewhere" leaves the host's; once the "elsewhere" shell has ended, the
    host requeues its job at once, long before expiry."""
    need("uts")
    far, here = queue.publish(name="far"), queue.publish(name="here")
    b = shlex.quote(str(box))
    proc = spawn(procs, ["unshare", "--uts", "sh", "-c", (
        "hostname elsewhere || exit 99\n"
        f"{CTX} queue claim --project proj --ttl 600 > {b}/job.tmp; mv {b}/job.tmp {b}/job\n"
        "exec sleep 300\n"
    )], queue_env(queue))  # fmt: skip
    assert wait_file(box / "job", proc) == far
    lease = queue.lease(far)
    assert (lease["host"], lease["pid"]) == ("elsewhere", proc.pid), lease
    assert int(lease["pid_ns"]) == HOST_PID_NS, lease
    assert queue.claim("--pid", str(child.pid), "--ttl", "600") == here

    rc, report = recover_json(queue.run("recover", "--reconcile", "--json"))
    assert rc == 0 and report["requeued"] == [], report
    assert jobs_in(report, "untouched") == sorted([far, here]), report
    renamed = subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname elsewhere && exec "$@"', "sh", *CTX_ARGV,
         "queue", "recover", "--project", "proj", "--json"],
        env=queue_env(queue), capture_output=True, text=True, timeout=WAIT,
    )  # fmt: skip
    rc, report = recover_json(renamed)
    assert rc == 0 and report["requeued"] == [], report
    assert all("is running" in e["detail"] for e in report["untouched"]), report

    end_group(proc)
    proc.communicate(timeout=WAIT)
    rc, report = recover_json(queue.run("recover", "--json"))
    assert rc == 0 and jobs_in(report, "requeued") == [far], report
    assert "has exited" in report["requeued"][0]["detail"], report
    assert queue.state(far) == "pending" and queue.state(here) == "claimed"


ODD_HOST = "ev\x1b]0;T\x07il"  # a host name carrying a terminal title sequence


def test_a_host_name_with_control_bytes_never_reaches_a_terminal_raw(queue, agent, procs, box):
    """Q-3, §2.4, W-1: in a UTS namespace whose host name carries ESC and BEL (sethostname
    takes any bytes), a worker and a claim that would derive their worker id from it are
    refused (EINVAL, exit 1) with nothing claimed; a claim with --worker records the host name
    as it is, and `show`, `recover`, `status` and `list` on the host print it escaped."""
    need("uts")
    job = queue.publish(name="odd")
    b = shlex.quote(str(box))
    rename = "import os, socket; socket.sethostname(os.environ['ODD'])"
    set_name = f"{shlex.quote(sys.executable)} -c {shlex.quote(rename)}"
    steps = (
        f"{set_name} || exit 99\n"
        f"{CTX} queue work --project proj --agent {AGENT} --drain > {b}/w.out 2> {b}/w.err; "
        f"echo $? > {b}/w.rc\n"
        f"{CTX} queue claim --project proj > {b}/c1.out 2> {b}/c1.err; echo $? > {b}/c1.rc\n"
        f"{CTX} queue claim --project proj --worker w1 --ttl 600 > {b}/c2.out 2> {b}/c2.err; "
        f"echo $? > {b}/c2.rc\n"
        "exec sleep 300\n"
    )
    proc = spawn(
        procs, ["unshare", "--uts", "sh", "-c", steps], {**queue_env(queue), "ODD": ODD_HOST}
    )
    assert wait_file(box / "c2.rc", proc) == "0", (box / "c2.err").read_text()
    for name in ("w", "c1"):
        err = (box / f"{name}.err").read_text()
        assert (box / f"{name}.rc").read_text().strip() == "1", (name, err)
        assert "EINVAL" in err and "Traceback" not in err, (name, err)
        said = (box / f"{name}.out").read_text() + err
        assert "\x1b" not in said and "\x07" not in said, (name, said)
    assert (box / "c2.out").read_text().strip() == job
    assert queue.entries("done") == set() and queue.entries("failed") == set()
    assert queue.lease(job)["host"] == ODD_HOST

    for args in (("show", job), ("recover",), ("status",), ("list",)):
        r = queue.run(*args)
        assert r.rc == 0 and "Traceback" not in r.err, r
        assert "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err, r
    shown = queue.run("show", job)
    assert "ev\\x1b]0;T\\x07il" in shown.out, shown
    end_group(proc)
    proc.communicate(timeout=WAIT)
    r = queue.run("recover")
    assert r.rc == 0 and "\x1b" not in r.out and queue.state(job) == "pending", r


# ============================================================================== user namespaces


def user_home(user: UnprivilegedUser) -> Path:
    home = new_scratch_dir(SCRATCH, "home")
    os.chown(home, user.uid, user.gid)
    return home


def in_userns(
    user: UnprivilegedUser, home: Path, shell: str, *extra: str
) -> subprocess.CompletedProcess:
    """``sh -c SHELL`` as ``user`` inside a new user namespace that maps it to uid 0
    (``unshare --map-root-user``), with ``extra`` unshare options."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), CTX=CTX_ARGV[0])
    return subprocess.run(
        ["unshare", "--map-root-user", *extra, "sh", "-c", shell],
        env=env, capture_output=True, text=True, timeout=WAIT, cwd=home,
        user=user.uid, group=user.gid, extra_groups=[],
    )  # fmt: skip


def test_a_user_who_is_uid_0_only_in_its_user_namespace_bootstraps_its_own_root(
    unprivileged_user,
):
    """R-1, R-5: a non-root user inside ``unshare --map-root-user`` (geteuid() == 0, no power
    over the machine): `ctx bootstrap` with no storage root named is refused with EACCES
    naming /var/lib/cortexfs and what to do, and creates nothing there; with --storage it
    makes a complete root the user owns, which a second bootstrap leaves as it is."""
    need_userns_for(unprivileged_user)
    system = Path("/var/lib/cortexfs")
    places = [system, system / "storage", system / "storage" / "current"]
    home = user_home(unprivileged_user)
    try:
        refused = in_userns(unprivileged_user, home, '"$CTX" bootstrap')
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("ctx: EACCES: "), refused
        assert "/var/lib/cortexfs" in refused.stderr and "--storage" in refused.stderr, refused
        assert "Traceback" not in refused.stderr
        made_there = [p for p in places if p.exists() and p.stat().st_uid == unprivileged_user.uid]
        assert made_there == [], made_there

        root = home / "st"
        made = in_userns(unprivileged_user, home, f'"$CTX" bootstrap --storage {root}')
        assert made.returncode == 0, made
        assert {p.name for p in root.iterdir()} >= {"bin", "tool", "agent", "model", "home",
                                                    "shared"}  # fmt: skip
        assert (root / "tool" / "fs.stat").is_file() and (root / "tool" / "tsh.d").is_dir()
        assert os.stat(root / "tool").st_uid == unprivileged_user.uid
        before_again = snapshot(root)
        again = in_userns(unprivileged_user, home, f'"$CTX" bootstrap --storage {root}')
        assert again.returncode == 0, again
        assert snapshot(root) == before_again
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_an_agent_made_in_a_user_namespace_is_refused_with_the_reason(unprivileged_user, storage):
    """A-3, P-5 step 1, T-3: inside ``unshare --map-root-user`` a non-root user is uid 0, so
    `ctx agent create` gives the agent root's default user, nobody (uid 65534), which is not
    mapped in that namespace: no process there can become it.  `ctx run --agent` is refused
    (exit 126, nothing run, no traceback), and the refusal must say what is wrong: that uid
    65534 cannot be used (is not mapped) here, not only that a session path is invalid."""
    need_userns_for(unprivileged_user)
    home = user_home(unprivileged_user)
    subprocess.run(["chown", "-R", f"{unprivileged_user.uid}:{unprivileged_user.gid}",
                    str(storage)], check=True)  # the user's own root  # fmt: skip
    try:
        trace = home / "ran"
        done = in_userns(unprivileged_user, home, (
            f"export CTX_STORAGE={storage}\n"
            "echo '{\"name\": \"coder\", \"label\": \"coder_t\", \"tools\": [\"shell.exec\"]}' "
            '| "$CTX" agent create - --json > created.json || exit 11\n'
            f"echo 'allow coder_t tool:shell.exec execute' >> {storage}/tool/shell.exec.d/policy\n"
            f'"$CTX" run --agent coder shell.exec "touch {trace}" > run.out 2> run.err\n'
            "echo $? > run.rc\n"
        ))  # fmt: skip
        assert done.returncode == 0, done
        created = json.loads((home / "created.json").read_text())
        assert created["identity"]["uid"] == 65534, created
        rc = int((home / "run.rc").read_text())
        err = (home / "run.err").read_text()
        assert rc == 126 and not trace.exists(), (rc, err)
        assert err.startswith("ctx: E") and "Traceback" not in err, err
        reason = err.split("\n")[0]
        assert any(word in reason for word in ("uid 65534", "mapped", "user namespace")), reason
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_mapped_root_workers_and_runs_refuse_before_claiming_and_a_real_worker_runs_each_job_once(
    queue, agent, outbox
):
    """W-1, I-1, I-4, P-5 step 1: root inside ``unshare --map-root-user`` (uid 0 mapped to 0,
    no capabilities over the machine) cannot become the agent's uid.  Its worker stops before
    claiming anything (exit 1, EINVAL, 'no job was claimed', the queue unchanged) and its
    `ctx run --agent --native` is refused (exit 1, an EINVAL result frame, the tool never
    runs).  A worker outside then runs each job exactly once."""
    need("userns")
    runs = outbox / "runs"
    jobs = [queue.publish(shell_job(f"echo {n} >> {runs}"), name=f"j{n}") for n in range(2)]
    before = snapshot(queue.dir)
    env = queue_env(queue)
    mapped = ["unshare", "--map-root-user", *CTX_ARGV]
    work = subprocess.run([*mapped, "queue", "work", "--project", "proj", "--agent", AGENT,
                           "--drain", "--json"], env=env, capture_output=True, text=True,
                          timeout=WAIT)  # fmt: skip
    assert work.returncode == 1 and "Traceback" not in work.stderr, work
    error = json.loads(work.stdout.splitlines()[-1])
    assert error["error"] == "EINVAL" and "no job was claimed" in error["message"], error
    assert snapshot(queue.dir) == before
    ran = subprocess.run([*mapped, "run", "--agent", AGENT, "--native", "shell.exec"],
                         input=json.dumps({"cmd": f"echo x >> {runs}"}), env=env,
                         capture_output=True, text=True, timeout=WAIT)  # fmt: skip
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran
    frame = json.loads(ran.stdout.splitlines()[-1])
    assert frame["type"] == "result" and frame["status"] == "error", frame
    assert frame["error"]["errno"] == 22, frame  # EINVAL: the agent's uid is beyond reach
    assert not runs.exists()

    r = queue.run("work", "--agent", AGENT, "--drain", timeout=60)
    assert r.rc == 0, r
    assert sorted(runs.read_text().split()) == ["0", "1"]
    assert [queue.only_result(j)[0] for j in jobs] == ["done"] * 2
    queue.assert_settled()


def test_mounts_in_user_namespaces(unprivileged_user, agent, storage, box):
    """F-1: a non-root user as uid 0 of its user and mount namespaces cannot open a /dev/fuse
    of mode 0600: `ctx mount`, and `ctx mount --as`, are refused with EACCES naming it, and
    nothing is mounted.  Root mapped to uid 0 of a user namespace mounts agent ci's view,
    which shows ci's tool alone, and `ctx umount` ends it (exit 0)."""
    need("userns", "fuse")
    if os.stat("/dev/fuse").st_mode & 0o006:
        pytest.skip("/dev/fuse is open to every user here")
    need_userns_for(unprivileged_user)
    where = box / "view"
    where.mkdir()
    where.chmod(0o777)
    for extra in ((), ("--as", AGENT)):
        mount = shlex.join([*CTX_ARGV, "mount", "--storage", str(storage), *extra, str(where)])
        shell = f"{mount}; echo rc=$?; grep -c ' {where} ' /proc/self/mountinfo"
        tried = in_userns(unprivileged_user, box, shell, "--mount", "--propagation", "private")
        assert "rc=1" in tried.stdout and tried.stdout.split()[-1] == "0", tried
        assert tried.stderr.startswith("ctx: EACCES: ") and "/dev/fuse" in tried.stderr, tried
        assert "Traceback" not in tried.stderr

    w = shlex.quote(str(where))
    view = subprocess.run(["unshare", "--map-root-user", "--mount", "--propagation", "private",
        "sh", "-c", (
            f"{CTX} mount --storage {shlex.quote(str(storage))} --as {AGENT} {w} & P=$!\n"
            f"i=0; until grep -q ' {where} ' /proc/self/mountinfo; do i=$((i+1)); "
            "[ $i -gt 400 ] && exit 90; sleep 0.05; done\n"
            f"ls {w}/tool; {CTX} umount {w}; echo umount=$?; wait $P; echo mount=$?\n"
        )], env=clean_env(), capture_output=True, text=True, timeout=WAIT)  # fmt: skip
    assert view.returncode == 0, view
    lines = view.stdout.split()
    assert "shell.exec" in lines and "fs.read" not in lines, view
    assert lines[-2:] == ["umount=0", "mount=0"], view


def test_a_member_mapped_to_uid_0_claims_from_the_group_queue_and_leaves_it_usable(den: Den):
    """Q-3, Q-4, X-1 (a queue shared by a group): a member inside ``unshare --map-root-user``
    (it believes it is root; its groups show as nogroup) claims and then finishes a job of the
    space.  The claim and lease it makes give the space's group access, root's recover and
    show see its holder alive, and its finish leaves one result the group may read."""
    need("userns")
    q = den.queue
    job = q.publish(name="mapped")
    inner = (f'J=$({CTX} queue claim --project {SPACE} --ttl 600) || exit 10\n'
             'echo "$J" > "$XDG_CACHE_HOME/job"\n'
             'until [ -e "$XDG_CACHE_HOME/go" ]; do sleep 0.05; done\n'
             f"echo '{{\"by\": \"mapped\"}}' | {CTX} queue finish --project {SPACE} \"$J\" "
             "--ok -\n")  # fmt: skip
    need_userns_for(den.member)
    drop = ["setpriv", f"--reuid={den.member.uid}", f"--regid={den.member.gid}",
            f"--groups={den.gid}", "--", "unshare", "--map-root-user", "sh", "-c",
            inner]  # fmt: skip
    proc = subprocess.Popen(drop, env=den.member_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")  # fmt: skip
    try:
        assert wait_file(den.cache / "job", proc) == job
        for path in (q.dir / "claimed" / job, q.dir / "lease" / job):
            st = os.stat(path)
            assert st.st_uid == den.member.uid and st.st_gid == den.gid, (path, st)
            assert stat.S_IMODE(st.st_mode) & 0o070 == 0o070, (path, oct(st.st_mode))
        st = os.stat(q.dir / "lease" / job / "worker")
        assert stat.S_IMODE(st.st_mode) & 0o060 == 0o060 and st.st_gid == den.gid
        shown = q.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["holder"]["state"] == "alive", shown
        rc, report = recover_json(q.run("recover", "--json"))
        assert rc == 0 and jobs_in(report, "untouched") == [job], report
        (den.cache / "go").touch()
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    state, res = q.only_result(job)
    assert state == "done" and res["output"] == {"by": "mapped"}, res
    st = os.stat(q.dir / "done" / f"{job}.result")
    assert st.st_gid == den.gid and stat.S_IMODE(st.st_mode) & 0o040, oct(st.st_mode)
    q.assert_settled()


# ============================================================================== mount namespaces


def test_a_mount_made_in_a_private_mount_namespace_is_not_unmounted_from_outside(
    storage, procs, box
):
    """F-1: `ctx mount` run in a private mount namespace serves there; from the parent
    namespace the mount point is an empty directory and `ctx umount` on it is refused (EINVAL,
    not a mount point, exit 1) without touching the mount, which still serves; `ctx umount`
    inside ends it and the mount process exits 0."""
    need("fuse")
    where = box / "mnt"
    where.mkdir()
    w, b = shlex.quote(str(where)), shlex.quote(str(box))
    proc = spawn(procs, ["unshare", "--mount", "--propagation", "private", "sh", "-c", (
        f"{CTX} mount --storage {shlex.quote(str(storage))} {w} & P=$!\n"
        f"until grep -q ' {where} ' /proc/self/mountinfo; do sleep 0.05; done\n"
        f"touch {b}/mounted; until [ -e {b}/go ]; do sleep 0.05; done\n"
        f"ls {w} > {b}/listing; {CTX} umount {w}; echo $? > {b}/umount.rc; wait $P; "
        f"echo $? > {b}/mount.rc\n"
    )], clean_env())  # fmt: skip
    wait_file(box / "mounted", proc, line=False)
    assert not mounted_at(where) and os.listdir(where) == []
    outside = ctx_run("umount", where)
    assert outside.rc == 1 and outside.err.startswith("ctx: EINVAL: "), outside
    assert "not a mount point" in outside.err, outside
    (box / "go").touch()
    assert wait_file(box / "mount.rc", proc) == "0"
    assert (box / "umount.rc").read_text().strip() == "0"
    assert set((box / "listing").read_text().split()) == {
        "agent",
        "bin",
        "home",
        "model",
        "shared",
        "tool",
    }


def sandbox_with_ctx(*ctx_options: str) -> list[str]:
    """A bubblewrap sandbox on a root of its own (so that /ctx is the sandbox's to place)
    holding the system, /tmp and this repository, with ``ctx_options`` placing /ctx."""
    return ["bwrap", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
            "--bind", "/tmp", "/tmp", "--ro-bind", str(REPO), str(REPO), "--bind", "/run", "/run",
            "--proc", "/proc", "--dev", "/dev", "--die-with-parent", *ctx_options]  # fmt: skip


def test_ctx_mounted_as_one_agents_view_does_not_decide_what_another_agent_may_run(storage, box):
    """T-4, T-5, A-3 (an agent's /ctx is the storage root, read-only), F-1: in a sandbox whose
    /ctx holds `ctx mount --as coder` (what coder may see, as the README mounts it), agent
    rev, granted fs.read in both policies, runs fs.read on the host with `ctx run --agent
    rev`: what rev may run comes from rev's view, not from the view another agent's mount
    puts at the host's /ctx."""
    need("bwrap", "fuse")
    env = clean_env(CTX_STORAGE=str(storage))
    data = box / "data"
    data.mkdir(mode=0o755)
    (data / "note.txt").write_text("hello from the host\n")
    (data / "note.txt").chmod(0o644)
    make_agent(storage, ["fs.stat"], name="coder")
    allow_in_tool_policy(storage, "fs.stat", "coder_t")
    rev = {"name": "rev", "label": "rev_t", "tools": ["fs.read"],
           "mount": [[str(data), "/data", "ro"]]}  # fmt: skip
    made = ctx_run("agent", "create", "-", input=json.dumps(rev), env=env)
    assert made.rc == 0, made
    allow_in_tool_policy(storage, "fs.read", "rev_t")
    read = ["run", "--agent", "rev", "fs.read", "/data/note.txt"]
    plain = ctx_run(*read, env=env)  # on the host, with nothing at /ctx
    assert plain.rc == 0 and "hello from the host" in plain.out, plain
    b = shlex.quote(str(box))
    inside = (
        f"{CTX} mount --as coder /ctx & P=$!\n"
        "i=0; until grep -q ' /ctx ' /proc/self/mountinfo; do i=$((i+1)); "
        "[ $i -gt 400 ] && exit 90; sleep 0.05; done\n"
        f"ls /ctx/tool > {b}/listing\n"
        f"{CTX} {shlex.join(read)} > {b}/run.out 2> {b}/run.err; echo $? > {b}/run.rc\n"
        f"{CTX} umount /ctx; wait $P\n"
    )
    done = subprocess.run([*sandbox_with_ctx("--dev-bind", "/dev/fuse", "/dev/fuse", "--dir",
                                             "/ctx"), "sh", "-c", inside],
                          env=env, capture_output=True, text=True, timeout=WAIT)  # fmt: skip
    assert done.returncode == 0, done
    assert "fs.read" not in (box / "listing").read_text().split()  # coder's view
    err = (box / "run.err").read_text()
    assert "Traceback" not in err, err
    assert (box / "run.rc").read_text().strip() == "0", err
    assert "hello from the host" in (box / "run.out").read_text()


def test_ctx_bound_to_another_tree_is_where_a_human_finds_tools_and_never_an_agent(storage, box):
    """T-4, T-8a, T-1: in a sandbox whose /ctx is a bind mount of another tree (not the
    storage root), `ctx object which --json` (a human's search) looks in /ctx/tool itself, as
    documented (/ctx maps onto the storage root only when nothing is mounted there), and finds
    the damaged tool there (no hooks/ in its controls); `ctx run --agent` looks in the storage
    root, an agent's /ctx being its view of that root, runs the storage root's tool, and the
    program of the tree never runs.  With nothing at /ctx both resolve in the storage root."""
    need("bwrap")
    make_agent(storage, ["fs.stat"], name="coder")
    allow_in_tool_policy(storage, "fs.stat", "coder_t")
    decoy = box / "decoy"
    (decoy / "tool" / "fs.stat.d").mkdir(parents=True)
    trace = box / "decoy-ran"
    program = decoy / "tool" / "fs.stat"
    program.write_text(f"#!/bin/sh\ntouch {trace}\necho '{{}}'\n")
    program.chmod(0o755)
    (decoy / "tool" / "fs.stat.d" / "policy").write_text("allow coder_t tool:fs.stat execute\n")
    os.chmod(box, 0o755)
    commands = (f"{CTX} object which --json fs.stat; echo; "
                f"{CTX} run --agent coder fs.stat /ctx; echo rc=$?")  # fmt: skip
    env = clean_env(CTX_STORAGE=str(storage))
    bound = subprocess.run([*sandbox_with_ctx("--ro-bind", str(decoy), "/ctx"), "sh", "-c",
                            commands], env=env, capture_output=True, text=True,
                           timeout=WAIT)  # fmt: skip
    found = json.loads(bound.stdout.splitlines()[0])
    assert found["path"] == "/ctx/tool/fs.stat", found
    assert found["search_path"]["directories"][0] == "/ctx/tool", found
    assert bound.stdout.split()[-1] == "rc=0", bound
    assert "Traceback" not in bound.stderr and not trace.exists()

    plain = subprocess.run([*sandbox_with_ctx(), "sh", "-c", commands], env=env,
                           capture_output=True, text=True, timeout=WAIT)  # fmt: skip
    found = json.loads(plain.stdout.splitlines()[0])
    assert found["path"] == str(storage / "tool" / "fs.stat"), found


# ============================================================================== agent terminals


def run_dir_free(run_dir: Path) -> bool:
    """Whether no terminal holds the lock of its run directory (or there is none)."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_ctx_agent_stop_on_the_host_never_signals_another_process_for_a_namespaced_terminal(
    _template, procs, box
):
    """A-1, A-2 (`ctx agent stop`), and the rule of Q-3/Q-5 that a pid alone means nothing
    across pid namespaces: `ctx agent start coder` run inside a pid namespace records its
    terminal's pid there.  A host process happens to have that pid number.  `ctx agent stop`
    run on the host must end the terminal (exit 0) and leave that host process alone."""
    need("pid", "bwrap", "fuse")
    with coder_host(_template, SCRATCH, ["fs.stat"], {}) as host:
        session = f"s{uuid.uuid4().hex[:8]}"
        b = shlex.quote(str(box))
        first = free_host_pids(64)
        ns = spawn(procs, [*new_pid_ns("unshare"), "sh", "-c", (
            f"echo {first - 1} > /proc/sys/kernel/ns_last_pid || exit 98\n"
            f"cd {shlex.quote(str(host.ws))} || exit 97\n"
            f"{CTX} agent start coder --session {session} --json > {b}/start.json "
            f"2> {b}/start.err; echo $? > {b}/start.rc\n"
            "exec sleep 300\n"
        )], host.env)  # fmt: skip
        assert wait_file(box / "start.rc", ns) == "0", (box / "start.err").read_text()
        run_dir = Path(json.loads((box / "start.json").read_text())["listening_at"]).parent
        recorded = int((run_dir / "pid").read_text())
        assert first <= recorded < first + 64, recorded
        decoy = process_at(recorded, ["sleep", "300"])
        if decoy is None:
            pytest.skip(f"pid {recorded} could not be given to a host process")
        stop = None
        try:
            stop = spawn(procs, [*CTX_ARGV, "agent", "stop", "coder", "--session", session],
                         host.env)  # fmt: skip
            wait_for(lambda: stop.poll() is not None or not alive(decoy.pid), WAIT)
            assert alive(decoy.pid), "the host process of the recorded pid number was signalled"
            assert stop.wait(WAIT) == 0, stop.communicate()
        finally:
            if stop is not None and stop.poll() is None:
                stop.kill()
            decoy.kill()
            decoy.wait()
            end_group(ns)
            ns.communicate(timeout=WAIT)
            if wait_for(lambda: run_dir_free(run_dir), WAIT):
                ctx_run("agent", "stop", "coder", "--session", session, env=host.env)


def test_a_terminal_started_by_a_namespaces_init_dies_with_it_and_is_cleaned_up_on_the_host(
    _template, box
):
    """A-1, A-2: `ctx agent start` run as pid 1 of a pid namespace answers 0, and its terminal
    ends with that namespace when the command exits.  On the host `ctx agent watch` then says
    no terminal runs (ENOENT, exit 1, no hang), a new `ctx agent start` of the same session
    cleans up what the dead one left and says so, and `ctx agent stop` ends the new one."""
    need("pid", "bwrap", "fuse")
    with coder_host(_template, SCRATCH, ["fs.stat"], {}) as host:
        session = f"s{uuid.uuid4().hex[:8]}"
        started = subprocess.run(
            [*new_pid_ns("unshare"), *CTX_ARGV, "agent", "start", "coder", "--session", session,
             "--json"], env=host.env, cwd=host.ws, capture_output=True, text=True, timeout=WAIT,
        )  # fmt: skip
        assert started.returncode == 0, started
        run_dir = Path(json.loads(started.stdout)["listening_at"]).parent
        assert wait_for(lambda: run_dir_free(run_dir), WAIT)
        watched = ctx_run("agent", "watch", "coder", "--session", session, env=host.env,
                          timeout=WAIT)  # fmt: skip
        assert watched.rc == 1 and watched.err.startswith("ctx: ENOENT: "), watched
        again = host.ctx("agent", "start", "coder", "--session", session, "--json", cwd=host.ws)
        assert again.rc == 0, again
        host.started.append(session)
        assert again.json().get("cleaned"), again
        assert "had ended without cleaning up" in again.err, again
        stopped = host.ctx("agent", "stop", "coder", "--session", session)
        assert stopped.rc == 0 and "stopped coder" in stopped.out, stopped
        host.started.remove(session)
        assert run_dir_free(run_dir)
