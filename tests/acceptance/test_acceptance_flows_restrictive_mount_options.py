"""The storage root, its tools, hooks, queues and terminals on filesystems mounted with the
restrictive options real hosts use (SPEC §1 R-1, R-5, §2 Q-1 … Q-8, I-1 … I-5, §3 W-1 … W-4,
§5 P-5, §6 T-1 … T-8, §7 H-1, H-3, §8 A-1, A-2, §9 X-1, docs/tools.md, docs/workers.md,
docs/queue.md): tools installed on a ``noexec`` root, a root turned ``noexec`` under a
draining worker, hook directories on ``noexec`` mounts, a tool whose interpreter lies on a
``noexec`` mount, a shared space on a ``nosuid,nodev`` root, a ``nosymfollow`` root and a
root named through a link on a ``nosymfollow`` mount, a root turned read-only in the middle of
``ctx queue recover``, a root on an ext4 image mounted ``sync,dirsync``, ``/tmp`` and
``$TMPDIR`` on ``noexec`` mounts, and a user's default root under a ``noexec,nosuid`` home.
Every filesystem is a real tmpfs, bind mount or loop-mounted ext4 image made for the test below
/tmp/<this file's stem>-<uid>/ and unmounted after it (lazily when a plain unmount fails)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    new_scratch_dir,
    requests_by_state,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.users import UnprivilegedUser, members_of
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts filesystems: needs root")

TRACEBACK = "Traceback (most recent call last)"
AGENT = "ci"
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
STAT_JOB = {"tool": "fs.stat", "input": {"path": "/ctx"}}
HELLO = "hello.say"
HELLO_PROGRAM = "#!/bin/sh\necho '{\"hi\": 1}'\n"
NOEXEC_WORDS = "is on a filesystem mounted noexec"
# Claim-order hints (docs/queue.md) of this test process, below its scratch directory rather
# than in root's /var/cache.
CACHE = scratch_top(__file__) / f"cache-{os.getpid()}"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

# ------------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module", autouse=True)
def _hint_cache() -> Iterator[None]:
    yield
    shutil.rmtree(CACHE, ignore_errors=True)


@pytest.fixture
def mounts() -> Iterator[ScratchMounts]:
    made = ScratchMounts(new_scratch_dir(scratch_top(__file__)))
    try:
        yield made
    finally:
        made.close()


def env_for(root: Path | str | None = None, **extra: str) -> dict[str, str]:
    env = clean_env(XDG_CACHE_HOME=str(CACHE), **extra)
    if root is not None:
        env["CTX_STORAGE"] = str(root)
    return env


def run_ctx(
    *args: object,
    env: dict[str, str],
    input: str = "",
    prefix: tuple[str, ...] = (),
    user: UnprivilegedUser | None = None,
) -> Run:
    """``ctx ARGS…`` as a real process (after ``prefix``, a command that execs what follows
    it), as ``user`` with its groups when given."""
    as_user = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": user.groups}
    done = subprocess.run(
        [*prefix, *CTX_ARGV, *map(str, args)], input=input.encode(), capture_output=True,
        env=env, cwd="/", timeout=120, **as_user,
    )  # fmt: skip
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def ctx(root: Path | str, *args: object, input: str = "") -> Run:
    """``ctx ARGS…`` on the storage root ``root`` (``CTX_STORAGE``)."""
    return run_ctx(*args, env=env_for(root), input=input)


def ok(run: Run) -> Run:
    assert run.rc == 0 and TRACEBACK not in run.err + run.out, run
    return run


def refused(run: Run, code: str, rc: int = 1) -> str:
    """``run`` exited ``rc`` with a ``ctx: CODE: …`` line and no traceback; that line."""
    assert TRACEBACK not in run.err + run.out, run
    assert run.rc == rc, run
    lines = [line for line in run.err.splitlines() if line.startswith(f"ctx: {code}: ")]
    assert lines, run
    return lines[-1]


def grant(root: Path, tier: Path, tool: str, label: str = f"{AGENT}_t") -> None:
    """The tool's half of P-6: ``allow LABEL tool:TOOL execute`` in ``TIER/TOOL.d/policy``."""
    with open(tier / f"{tool}.d" / "policy", "a") as policy:
        policy.write(f"allow {label} tool:{tool} execute\n")


def make_world(root: Path, tools: tuple[str, ...] = ("fs.stat",), manifests=()) -> Path:
    """``root`` made by ``ctx queue init --project proj``, the ``manifests`` installed in the
    system tier, and agent ``ci`` (uid nobody) allowed ``tools`` by both policies (P-6)."""
    ok(ctx(root, "queue", "init", "--project", "proj"))
    for manifest in manifests:
        ok(ctx(root, "object", "install", manifest, "--tier", "system"))
    request = {"name": AGENT, "label": f"{AGENT}_t", "tools": list(tools)}
    ok(ctx(root, "agent", "create", "-", input=json.dumps(request)))
    for tool in tools:
        grant(root, root / "tool", tool)
    return root


def publish_batch(root: Path, jobs: list[dict], project: str = "proj") -> list[str]:
    lines = "".join(json.dumps(job) + "\n" for job in jobs)
    made = ok(ctx(root, "queue", "publish", "--project", project, "--batch", "-", input=lines))
    assert len(made.lines()) == len(jobs), made
    return made.lines()


def drain(root: Path, *extra: str, project: str = "proj") -> Run:
    return ctx(root, "queue", "work", "--project", project, "--agent", AGENT, "--drain", *extra)


def result_of(queue: Path, state: str, job: str) -> dict:
    return json.loads((queue / state / f"{job}.result").read_text())


def settled(root: Path, queue: Path, expected: dict[str, str], project: str = "proj") -> None:
    """Exactly ``expected`` on disk, one state each with its result, nothing in flight, and
    ``recover --reconcile`` calls the queue consistent and changes nothing."""
    assert requests_by_state(queue) == {job: [state] for job, state in expected.items()}
    for job, state in expected.items():
        if state in ("done", "failed"):
            assert (queue / state / f"{job}.result").is_file(), job
    for sub in ("claimed", "lease", "inbox"):
        assert os.listdir(queue / sub) == [], (sub, os.listdir(queue / sub))
    again = ok(ctx(root, "queue", "recover", "--project", project, "--reconcile", "--json"))
    assert again.json()["consistent"] is True, again
    assert again.json()["requeued"] == again.json()["repaired"] == [], again


def runs_in(outbox: Path) -> dict[str, int]:
    """How many times each tagged job ran: the lines its run appended to ``outbox/TAG``."""
    return {p.name: p.read_text().count("run") for p in outbox.iterdir() if p.name[0] == "t"}


def outbox_in(top: Path) -> Path:
    """A directory below ``top`` every uid may write in, where the tools leave their traces."""
    box = top / "outbox"
    box.mkdir()
    box.chmod(0o1777)
    return box


# ------------------------------------------------------------------------------ noexec


def test_tools_installed_on_a_noexec_root_are_refused_by_name_and_each_job_fails_once(
    mounts: ScratchMounts,
) -> None:
    """T-1, T-5, T-7, T-8, P-5 step 2, H-3, W-1, I-1, I-3: on a root mounted ``noexec`` a tool
    installed there is refused (EACCES, step 2, exit 126) naming the tool and noexec;
    ``ctx tool tsh.config``, which runs inside ctx,
    still answers.  A worker with two job slots finishes every job of an installed and of a
    core tool in ``failed/`` with that reason, exits 0 and leaves nothing claimed; each refusal
    is in the tool's log.  Remounted ``exec``, recover requeues none of them (failed is
    terminal) and a new job runs."""
    disk = mounts.tmpfs("disk", "size=32m,mode=0755,noexec")
    manifest = tool_manifest(mounts.top / "src", HELLO, HELLO_PROGRAM)
    root = make_world(disk / "st", ("fs.stat", HELLO), [manifest])
    queue = root / "shared/proj/queue"

    line = refused(ctx(root, "run", "--agent", AGENT, HELLO), "EACCES", 126)
    assert "step 2" in line and f"tool/{HELLO} {NOEXEC_WORDS}" in line, line
    assert "max_loaded_tools=" in ok(ctx(root, "tool", "tsh.config")).out

    jobs = publish_batch(root, [{"tool": HELLO, "input": {}}, STAT_JOB])
    worked = ok(drain(root, "--concurrency", "2", "--json"))
    finished = [json.loads(e) for e in worked.lines() if '"finish"' in e]
    assert sorted(e["job"] for e in finished) == sorted(jobs), worked
    for job in jobs:
        reason = result_of(queue, "failed", job)["reason"]
        assert reason.startswith("EACCES: step 2") and NOEXEC_WORDS in reason, reason
    settled(root, queue, dict.fromkeys(jobs, "failed"))
    log = [json.loads(x) for x in (root / "tool" / f"{HELLO}.d" / "log").read_text().splitlines()]
    refusals = [e for e in log if e["type"] == "tool_result" and e.get("errno") == "EACCES"]
    assert len(refusals) == 2 and all(e["step"] == 2 for e in refusals), log  # a call, a job

    mounts.remount(disk, "exec")
    (again,) = publish_batch(root, [{"tool": HELLO, "input": {}}])
    ok(drain(root))
    assert result_of(queue, "done", again)["output"] == {"hi": 1}
    settled(root, queue, {**dict.fromkeys(jobs, "failed"), again: "done"})


def test_a_root_turned_noexec_under_a_draining_worker_runs_nothing_twice_and_loses_nothing(
    mounts: ScratchMounts,
) -> None:
    """W-1, W-4, T-5, P-5 step 2, I-1, I-3, I-4: while a worker drains four ``shell.exec``
    jobs the root is remounted ``noexec`` during the first one.  That job, whose tool runs
    already, finishes in ``done/``; each job claimed after is finished in ``failed/`` with
    EACCES naming noexec, without running; the worker exits 0; no job runs twice, none is
    left claimed or pending.  Remounted ``exec``, the failed jobs stay failed."""
    disk = mounts.tmpfs("disk", "size=32m,mode=0755")
    root = make_world(disk / "st", ("shell.exec",))
    queue = root / "shared/proj/queue"
    box = outbox_in(mounts.top)
    cmd = (
        "echo run >> {box}/{tag}; if mkdir {box}/first 2>/dev/null; then touch {box}/started; "
        "while [ ! -e {box}/go ]; do sleep 0.02; done; fi"
    )
    tags = [f"t{i}" for i in range(4)]
    jobs = publish_batch(
        root, [{"tool": "shell.exec", "input": {"cmd": cmd.format(box=box, tag=t)}} for t in tags]
    )
    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
         "--timeout", "60"],
        env=env_for(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: (box / "started").exists(), 30), "the first job never started"
        mounts.remount(disk, "noexec")
        (box / "go").touch()
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0 and TRACEBACK not in err, (out, err)
    assert "1 done, 3 failed" in out, out
    assert runs_in(box) == {next(t for t in tags if (box / t).exists()): 1}, runs_in(box)
    states = {job: state for job, (state,) in requests_by_state(queue).items()}
    assert sorted(states.values()) == ["done", "failed", "failed", "failed"], states
    for job in jobs:
        if states[job] == "failed":
            reason = result_of(queue, "failed", job)["reason"]
            assert reason.startswith("EACCES: step 2") and NOEXEC_WORDS in reason, reason
    mounts.remount(disk, "exec")
    settled(root, queue, states)
    assert sum(runs_in(box).values()) == 1


def test_hooks_on_a_noexec_mount_veto_the_call_and_post_hooks_report_it(
    mounts: ScratchMounts,
) -> None:
    """T-6, T-5, P-5 step 2, docs/tools.md (Hooks: "a guard that cannot run must not let calls
    through"): a tool's ``hooks/pre.d`` bind-mounted ``noexec`` holding a hook that would let
    every call through: the call is refused with EACCES naming the hook and noexec, and
    neither the hook nor the tool ran.  With ``hooks/post.d`` ``noexec`` instead, the call
    succeeds with its output and its result lists the post-hook as failed, naming noexec."""
    disk = mounts.tmpfs("disk", "size=32m,mode=0755")
    box = outbox_in(mounts.top)
    program = f"#!/bin/sh\necho run >> {box}/tool\necho '{{\"hi\": 1}}'\n"
    manifest = tool_manifest(mounts.top / "src", HELLO, program)
    root = make_world(disk / "st", (HELLO,), [manifest])
    hooks = root / "tool" / f"{HELLO}.d" / "hooks"
    for phase in ("pre", "post"):
        hook = hooks / f"{phase}.d" / "10-pass"
        hook.write_text(f"#!/bin/sh\necho run >> {box}/hook-{phase}\nexit 0\n")
        hook.chmod(0o755)
    assert ok(ctx(root, "run", "--agent", AGENT, HELLO)).out == '{"hi": 1}\n'
    assert runs_in(box) == {"tool": 1}
    assert (box / "hook-pre").read_text() == (box / "hook-post").read_text() == "run\n"

    pre = mounts.bind_self(hooks / "pre.d", "noexec")
    line = refused(ctx(root, "run", "--agent", AGENT, HELLO), "EACCES", 126)
    assert "hooks/pre.d/10-pass" in line and NOEXEC_WORDS in line, line
    native = ctx(root, "run", "--agent", AGENT, "--native", HELLO, input="{}")
    frame = json.loads(native.lines()[-1])
    assert native.rc == 1 and frame["error"]["error"] == "EACCES", native
    assert frame["error"]["stage"] == "hook" and NOEXEC_WORDS in frame["error"]["message"], frame
    assert runs_in(box) == {"tool": 1} and (box / "hook-pre").read_text() == "run\n"
    mounts.unmount(pre)

    mounts.bind_self(hooks / "post.d", "noexec")
    native = ok(ctx(root, "run", "--agent", AGENT, "--native", HELLO, input="{}"))
    frame = json.loads(native.lines()[-1])
    assert frame["status"] == "ok" and frame["output"] == {"hi": 1}, frame
    (failed,) = frame["post_hooks"]
    assert failed["hook"] == "hooks/post.d/10-pass" and failed["exit_status"] != 0, frame
    assert NOEXEC_WORDS in failed["message"], failed
    assert runs_in(box) == {"tool": 2} and (box / "hook-post").read_text() == "run\n"


def test_a_tool_whose_interpreter_is_on_a_noexec_mount_is_refused_with_eacces(
    mounts: ScratchMounts,
) -> None:
    """T-1, T-5, W-1, docs/tools.md (stage ``run``: "the process could not start"),
    docs/workers.md (a failed job's ``error`` and ``reason``): a tool whose ``#!`` names an
    interpreter in a directory mounted ``noexec`` (a virtual environment under a home mounted
    so) cannot start: the kernel refuses its exec with EACCES.  A worker finishes its job in
    ``failed/`` (nothing lost, nothing claimed).  The call's error is that EACCES, not a
    made-up exit status of a tool that never ran."""
    venv = mounts.tmpfs("home", "size=8m,mode=0755,noexec") / "venv" / "bin"
    venv.mkdir(parents=True)
    shutil.copy2("/bin/sh", venv / "sh")
    manifest = tool_manifest(mounts.top / "src", HELLO, f"#!{venv}/sh\necho '{{}}'\n")
    root = make_world(mounts.tmpfs("disk", "size=32m,mode=0755") / "st", (HELLO,), [manifest])
    queue = root / "shared/proj/queue"
    (job,) = publish_batch(root, [{"tool": HELLO, "input": {}}])
    worked = ok(drain(root))
    settled(root, queue, {job: "failed"})
    result = result_of(queue, "failed", job)
    native = ctx(root, "run", "--agent", AGENT, "--native", HELLO, input="{}")
    frame = json.loads(native.lines()[-1])
    assert native.rc == 1 and frame["status"] == "error" and TRACEBACK not in native.err, native

    said = ((frame["error"], frame["error"]["message"]), (result["error"], result["reason"]))
    for error, reason in said:
        assert error["error"] == "EACCES", (error, worked)
        assert "exited with status" not in reason, reason


def test_a_noexec_tool_tier_below_an_exec_root_is_not_blamed_on_the_root(
    mounts: ScratchMounts,
) -> None:
    """T-5, P-5 step 2, X-1, docs/policy.md (step 2: "a tool on a filesystem mounted noexec
    is denied"): a shared space's ``tool/`` is a filesystem of its own mounted ``noexec`` (a
    project share mounted so), the storage root's filesystem is mounted with exec.  A call of
    a tool installed there, and a worker's job of it, are refused (EACCES, step 2) naming
    noexec; the remedy points at that filesystem, not at moving the storage root, which is on
    a filesystem mounted with exec already."""
    (member,), gid = members_of("ctxmo-g", "ctxmo-m")
    root = mounts.tmpfs("disk", "size=32m,mode=0755") / "st"
    ok(ctx(root, "bootstrap"))
    ok(ctx(root, "shared", "create", "team", "--group", "ctxmo-g"))
    tier = mounts.tmpfs(root / "shared" / "team" / "tool", f"size=4m,mode=2750,gid={gid},noexec")
    manifest = tool_manifest(mounts.top / "src", "team.say", HELLO_PROGRAM)
    ok(ctx(root, "object", "install", manifest, "--tier", "shared:team"))
    request = {"name": "tm", "label": "tm_t", "tools": ["team.say"], "shared": {"team": ["read"]}}
    ok(ctx(root, "agent", "create", "-", "--user", member.name, input=json.dumps(request)))
    grant(root, tier, "team.say", "tm_t")
    assert not os.statvfs(root).f_flag & os.ST_NOEXEC

    line = refused(ctx(root, "run", "--agent", "tm", "team.say"), "EACCES", 126)
    assert "step 2" in line and NOEXEC_WORDS in line, line
    (job,) = publish_batch(root, [{"tool": "team.say", "input": {}}], project="team")
    ok(ctx(root, "queue", "work", "--project", "team", "--agent", "tm", "--drain"))
    reason = result_of(root / "shared/team/queue", "failed", job)["reason"]
    assert NOEXEC_WORDS in reason, reason
    for said in (line, reason):
        assert "put the storage root on a filesystem mounted with exec" not in said, said


# ------------------------------------------------------------------------------ nosuid, nodev


def test_a_shared_space_on_a_nosuid_nodev_root_keeps_its_group_and_the_agents_ids(
    mounts: ScratchMounts,
) -> None:
    """X-1, T-5, W-1, R-4, §2.4: ``nosuid`` and ``nodev`` do not touch setgid directories.  On
    such a root ``ctx shared create team --group G`` makes the space setgid in G; a member's
    published job, run by a worker as an agent whose uid is that member, runs with the
    member's uid, gid and group G; what the tool makes in ``data/`` belongs to G, directories
    setgid; request and result are in G; status lists nothing as not inheriting the group."""
    (member,), gid = members_of("ctxmo-g", "ctxmo-m")
    root = mounts.tmpfs("disk", "size=32m,mode=0755,nosuid,nodev") / "st"
    ok(ctx(root, "bootstrap"))
    ok(ctx(root, "shared", "create", "team", "--group", "ctxmo-g"))
    space = root / "shared" / "team"
    request = {"name": "b", "label": "b_t", "tools": ["shell.exec"],
               "shared": {"team": ["read", "write"]}}  # fmt: skip
    ok(ctx(root, "agent", "create", "-", "--user", "ctxmo-m", input=json.dumps(request)))
    grant(root, root / "tool", "shell.exec", "b_t")
    data = space / "data"
    cmd = (f"id -u; id -g; id -G; mkdir {data}/d && touch {data}/d/f {data}/f && "
           f"stat -c '%g %a' {data}/d {data}/d/f {data}/f")  # fmt: skip
    job = {"tool": "shell.exec", "input": {"cmd": cmd}}
    published = run_ctx("queue", "publish", "--project", "team", "-", env=env_for(root),
                        input=json.dumps(job), user=member)  # fmt: skip
    name = ok(published).out.strip()
    worked = ctx(root, "queue", "work", "--project", "team", "--agent", "b", "--drain")
    assert ok(worked).out.count("done ") == 1, worked
    queue = space / "queue"
    uid, primary, groups, d, df, f = result_of(queue, "done", name)["output"].splitlines()
    assert (int(uid), int(primary)) == (member.uid, member.gid)
    assert gid in {int(g) for g in groups.split()}, groups
    group, mode = d.split()
    assert int(group) == gid and int(mode, 8) & 0o2000, d  # setgid, as the space's directories
    assert df.split()[0] == f.split()[0] == str(gid), (df, f)
    for path in (queue / "done" / name, queue / "done" / f"{name}.result"):
        assert path.stat().st_gid == gid, path
    status = ok(ctx(root, "queue", "status", "--project", "team", "--json")).json()
    assert status["group_not_inherited"] == [], status
    settled(root, queue, {name: "done"}, project="team")


# ------------------------------------------------------------------------------ nosymfollow


def attach_and_type(listening_at: str, line: str, expect: str) -> str:
    """Attach to the terminal socket ``listening_at`` (A-2), wait for tsh's prompt, type
    ``line``; what came back once ``expect`` showed after it (or after 30 s)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.2)
    data = b""

    def read_until(text: bytes, after: int = 0) -> None:
        nonlocal data
        deadline = time.monotonic() + 30
        while text not in data[after:] and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                chunk = sock.recv(65536)
                if not chunk:
                    return
                data += chunk

    try:
        sock.connect(listening_at)
        sock.sendall(b"attach\n")
        sock.sendall(b"\r")  # a fresh prompt, whatever the terminal showed before
        read_until(f"{AGENT}$ ".encode())
        typed_at = len(data)
        sock.sendall(line.encode() + b"\r")
        read_until(expect.encode(), typed_at)
    finally:
        sock.close()
    return data.decode("utf-8", "replace")


def test_a_nosymfollow_root_keeps_its_queue_tools_and_terminal_working(
    mounts: ScratchMounts,
) -> None:
    """Q-8, R-1, T-3, T-5, W-1, A-1, A-2, docs/tools.md (the fs.* tools never follow links):
    the storage root and an agent's workspace on ``nosymfollow`` mounts change nothing.  A
    symlink planted in ``pending/`` is listed as ignored and left alone while a worker runs
    the job beside it; ``fs.read`` reads a workspace file and refuses a link in the workspace
    with ELOOP, as on any mount; and an agent terminal started on
    that root runs a tool typed into it."""
    root = mounts.tmpfs("disk", "size=32m,mode=0755,nosymfollow") / "st"
    ws = mounts.tmpfs("ws", "size=4m,mode=0755,nosymfollow")
    (ws / "a.txt").write_text("hello\n")
    (ws / "l.txt").symlink_to("a.txt")
    ok(ctx(root, "queue", "init", "--project", "proj"))
    request = {"name": AGENT, "label": f"{AGENT}_t", "tools": ["fs.read", "fs.stat"],
               "mount": [[str(ws), "/workspace", "ro"]]}  # fmt: skip
    ok(ctx(root, "agent", "create", "-", input=json.dumps(request)))
    for tool in ("fs.read", "fs.stat"):
        grant(root, root / "tool", tool)
    queue = root / "shared/proj/queue"
    planted = mounts.top / "planted.json"
    planted.write_text(json.dumps(STAT_JOB))
    (queue / "pending" / "evil.req.json").symlink_to(planted)
    (job,) = publish_batch(root, [STAT_JOB])
    status = ok(ctx(root, "queue", "status", "--project", "proj", "--json")).json()
    assert [i["path"] for i in status["ignored"]] == ["pending/evil.req.json"], status
    assert status["counts"]["pending"] == 1, status
    ok(drain(root))
    assert result_of(queue, "done", job)["status"] == "ok"
    assert os.readlink(queue / "pending" / "evil.req.json") == str(planted)

    assert ok(ctx(root, "run", "--agent", AGENT, "fs.read", "/workspace/a.txt")).out == "hello\n"
    link = ctx(root, "run", "--agent", AGENT, "fs.read", "/workspace/l.txt")
    assert link.rc != 0 and "ELOOP" in link.err and "never followed" in link.err, link

    if shutil.which("bwrap") is None:
        return
    started = ctx(root, "agent", "start", AGENT, "--no-workspace", "--session", "s1", "--json")
    try:
        facts = ok(started).json()
        shown = attach_and_type(facts["listening_at"], "fs.stat /ctx", "type: directory")
        assert "type: directory" in shown, shown
    finally:
        ctx(root, "agent", "stop", AGENT, "--session", "s1")


def test_a_current_link_on_a_nosymfollow_mount_is_not_called_a_link_to_nothing(
    mounts: ScratchMounts,
) -> None:
    """R-1 (``…/storage/current``), R-5, §2.4, README (``storage/current`` may be a link to a
    release): a root named by the link ``storage/current -> r1`` works; once its filesystem
    is remounted ``nosymfollow`` (the link can no longer be followed), each command either
    still works through the link or is refused saying the link cannot be followed (ELOOP,
    nosymfollow); none tells the administrator that ``r1``, which is there, does not exist
    and to point the link elsewhere."""
    disk = mounts.tmpfs("disk", "size=32m,mode=0755")
    release = disk / "storage" / "r1"
    ok(ctx(release, "queue", "init", "--project", "proj"))
    current = disk / "storage" / "current"
    current.symlink_to("r1")
    ok(ctx(current, "queue", "status", "--project", "proj"))
    mounts.remount(disk, "nosymfollow")
    assert (release / "tool").is_dir()
    for args in (("queue", "status", "--project", "proj"), ("bootstrap",)):
        run = ctx(current, *args)
        assert TRACEBACK not in run.err, run
        if run.rc != 0:
            assert "does not exist" not in run.err, run
            assert "ELOOP" in run.err or "nosymfollow" in run.err, run


def test_bootstrap_through_a_link_on_a_nosymfollow_mount_says_what_stops_it(
    mounts: ScratchMounts,
) -> None:
    """R-1, R-5: a root whose path passes through a directory link on a filesystem mounted
    ``nosymfollow`` (``/srv/ctx -> data``, say).  ``queue status`` reaches it there; bootstrap
    either reaches it too (it has nothing to do) or is refused saying the link cannot be
    followed (ELOOP, nosymfollow).  It must not say it cannot create the root, a directory
    that exists, because it "is not a directory"."""
    disk = mounts.tmpfs("disk", "size=32m,mode=0755")
    (disk / "data").mkdir()
    ok(ctx(disk / "data" / "st", "queue", "init", "--project", "proj"))
    (disk / "srv").symlink_to("data")
    root = disk / "srv" / "st"
    ok(ctx(root, "bootstrap"))
    mounts.remount(disk, "nosymfollow")
    ok(ctx(root, "queue", "status", "--project", "proj"))
    boot = ctx(root, "bootstrap")
    assert TRACEBACK not in boot.err, boot
    if boot.rc != 0:
        assert f"cannot create {root}" not in boot.err, boot
        assert "ELOOP" in boot.err or "nosymfollow" in boot.err, boot


def test_a_new_root_directly_below_a_directory_link_is_made(mounts: ScratchMounts) -> None:
    """R-1, R-5 ("creates or repairs a storage root"): met while setting up the test above,
    on a mount with no restrictive option at all: the deepest existing directory of a new
    root's path is reached through a link (``/srv/ctx -> /data/ctx``, a ``~/.local/share``
    kept by a dotfile manager).  Bootstrap makes the root there, as ``queue status`` and every
    other command then reach it through that link (the root's own path, R-1); at the least it
    must not call the link's directory "not a directory"."""
    disk = mounts.tmpfs("disk", "size=32m,mode=0755")
    (disk / "data").mkdir()
    (disk / "srv").symlink_to("data")
    made = ctx(disk / "srv" / "st", "bootstrap")
    assert TRACEBACK not in made.err, made
    assert made.rc == 0 or "Not a directory" not in made.err, made
    assert (disk / "data" / "st" / "tool").is_dir(), made


# ------------------------------------------------------------------------------ read-only


def test_a_root_turned_read_only_in_the_middle_of_recover_leaves_every_job_recoverable(
    mounts: ScratchMounts,
) -> None:
    """Q-5, Q-6, Q-7, I-1, I-5, §2.4, docs/queue.md ("a write refused because the filesystem
    is mounted read-only is EROFS saying so"): ``ctx queue recover`` requeues 400 jobs whose
    holders are gone; the root's filesystem is remounted read-only while it runs.  It exits 1
    without a traceback, every job it could not requeue named with EROFS, 'read-only' and what
    became of it; every job is still pending or claimed, once.  Remounted read-write, recover
    and ``recover --reconcile`` bring all 400 to ``pending/``, each once, and a second
    reconcile changes nothing."""
    disk = mounts.tmpfs("disk", "size=64m,mode=0755")
    root = disk / "st"
    ok(ctx(root, "queue", "init", "--project", "proj"))
    queue = root / "shared/proj/queue"
    count = 400
    jobs = publish_batch(root, [STAT_JOB] * count)
    gone = subprocess.Popen(["true"])
    gone.wait()
    template = ok(ctx(root, "queue", "claim", "--project", "proj", "--pid", gone.pid)).out.strip()
    lease = json.loads((queue / "lease" / template / "worker").read_text())
    lease["expires_at"] = "2001-01-01T00:00:00Z"  # expired: the holder is provably gone
    for job in jobs:  # the claims a worker that died held, as it left them
        if job != template:
            (queue / "claimed" / job).mkdir()
            os.rename(queue / "pending" / job, queue / "claimed" / job / job)
            (queue / "lease" / job).mkdir()
        (queue / "lease" / job / "worker").write_text(json.dumps({**lease, "job": job}))
    assert requests_by_state(queue) == {job: ["claimed"] for job in jobs}

    recover = subprocess.Popen(
        [*CTX_ARGV, "queue", "recover", "--project", "proj", "--json"], env=env_for(root),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: len(os.listdir(queue / "pending")) >= 20, 30, 0.005)
        assert mounts.remount(disk, "ro", tries=400), "the root could not be made read-only"
        out, err = recover.communicate(timeout=60)
    finally:
        if recover.poll() is None:
            recover.kill()
            recover.communicate()
    assert recover.returncode == 1 and TRACEBACK not in err, (out[-2000:], err)
    report = json.loads(out)
    assert report["consistent"] is False, report["errors"][:3]
    assert report["errors"], "recover met no read-only filesystem"
    for error in report["errors"]:
        assert error["error"] == "EROFS" and "read-only" in error["detail"], error
        assert "left as it is" in error["detail"] or "--reconcile" in error["detail"], error
    assert len(report["requeued"]) + len(report["errors"]) == count, report["errors"][:3]
    states = requests_by_state(queue)
    assert set(states) == set(jobs) and all(len(s) == 1 for s in states.values())

    mounts.remount(disk, "rw")
    plain = ctx(root, "queue", "recover", "--project", "proj")  # 1: an incomplete pair is left
    assert plain.rc in (0, 1) and TRACEBACK not in plain.err and "EROFS" not in plain.out, plain
    fixed = ctx(root, "queue", "recover", "--project", "proj", "--reconcile", "--json")
    assert ok(fixed).json()["consistent"] is True, fixed
    settled(root, queue, dict.fromkeys(jobs, "pending"))


# ------------------------------------------------------------------------------ sync, dirsync


def test_a_root_on_ext4_mounted_sync_dirsync_works_end_to_end(mounts: ScratchMounts) -> None:
    """R-1, R-5, T-8, W-1, Q-1 … Q-7, S-5: a root on a loop-mounted ext4 image mounted ``sync,
    dirsync`` (every write and directory change synchronous): bootstrap, an install, an agent,
    and a batch of an installed and a core tool's jobs published and drained by a worker
    with two slots all work; recover finds the queue consistent."""
    disk = mounts.ext4("disk", "sync,dirsync")
    manifest = tool_manifest(mounts.top / "src", HELLO, HELLO_PROGRAM)
    root = make_world(disk / "st", ("fs.stat", HELLO), [manifest])
    queue = root / "shared/proj/queue"
    jobs = publish_batch(root, [{"tool": HELLO, "input": {}}, STAT_JOB] * 2)
    worked = ok(drain(root, "--concurrency", "2"))
    assert worked.out.count("done ") == len(jobs), worked
    settled(root, queue, dict.fromkeys(jobs, "done"))


# ------------------------------------------------------------------------------ /tmp, TMPDIR


def test_tmp_and_tmpdir_on_noexec_mounts_stop_nothing_ctx_runs(mounts: ScratchMounts) -> None:
    """R-5, T-8, W-1, A-1, H-1: with ``/tmp`` remounted ``noexec`` (in a mount namespace of
    the commands' own) and ``$TMPDIR`` a ``noexec`` tmpfs, nothing CortexFS runs is staged
    there: bootstrap of a new root, an install, an agent's call of an installed tool, a
    worker's drain of a core and an installed tool's jobs, and an agent terminal running a
    tool all work."""
    root = mounts.tmpfs("disk", "size=32m,mode=0755") / "st"
    tmpdir = mounts.tmpfs("tmpdir", "size=8m,mode=1777,noexec")
    manifest = tool_manifest(mounts.top / "src", HELLO, HELLO_PROGRAM)
    # /tmp bound on itself with its submounts (the root's tmpfs keeps exec), then noexec.
    noexec_tmp = (
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount --rbind /tmp /tmp && mount -o remount,bind,noexec /tmp && exec "$@"', "sh",
    )  # fmt: skip
    env = env_for(root, TMPDIR=str(tmpdir))

    def inside(*args: object, input: str = "") -> Run:
        return run_ctx(*args, env=env, input=input, prefix=noexec_tmp)

    if Path(os.path.realpath(CTX_ARGV[0])).is_relative_to("/tmp"):
        pytest.skip("ctx itself is installed below /tmp, which this test makes noexec")
    options = subprocess.run([*noexec_tmp, "findmnt", "-n", "-o", "OPTIONS", "-T", "/tmp"],
                             capture_output=True, text=True)  # fmt: skip
    if options.returncode != 0:
        pytest.skip(f"cannot remount /tmp in a mount namespace: {options.stderr.strip()}")
    assert "noexec" in options.stdout.split(","), options

    boot = ok(inside("bootstrap"))
    assert "noexec" not in boot.out + boot.err, boot
    ok(inside("queue", "init", "--project", "proj"))
    ok(inside("object", "install", manifest, "--tier", "system"))
    request = {"name": AGENT, "label": f"{AGENT}_t", "tools": ["fs.stat", HELLO]}
    ok(inside("agent", "create", "-", input=json.dumps(request)))
    for tool in ("fs.stat", HELLO):
        grant(root, root / "tool", tool)
    assert ok(inside("run", "--agent", AGENT, HELLO)).out == '{"hi": 1}\n'
    jobs = publish_batch(root, [{"tool": HELLO, "input": {}}, STAT_JOB])
    ok(inside("queue", "work", "--project", "proj", "--agent", AGENT, "--drain"))
    settled(root, root / "shared/proj/queue", dict.fromkeys(jobs, "done"))

    if shutil.which("bwrap") is None:
        return
    started = inside("agent", "start", AGENT, "--no-workspace", "--session", "s1", "--json")
    try:
        facts = ok(started).json()
        shown = attach_and_type(facts["listening_at"], HELLO, '{"hi": 1}')
        assert '{"hi": 1}' in shown, shown
    finally:
        ctx(root, "agent", "stop", AGENT, "--session", "s1")


# ------------------------------------------------------------------------------ a user's home


def test_a_users_default_root_under_a_noexec_nosuid_home_says_why_nothing_runs(
    mounts: ScratchMounts, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1 (the default root ``$HOME/.local/share/cortexfs/storage/current`` of a user with
    no ``XDG_DATA_HOME``), R-5, T-5, P-5 step 2, W-1, H-3: a non-root user whose home is
    mounted ``noexec,nosuid`` bootstraps the default root there, warned that nothing of it can
    run because of noexec; its agent's calls are refused with EACCES naming noexec, a worker
    finishes the job in ``failed/`` with that reason and exits 0, and ``ctx tool tsh.config``
    (run inside ctx) answers."""
    user = unprivileged_user
    home = mounts.tmpfs("home", f"size=16m,mode=0755,noexec,nosuid,uid={user.uid},gid={user.gid}")
    env = {"PATH": PATH, "HOME": str(home), "USER": user.name, "LOGNAME": user.name}

    def as_user(*args: object, input: str = "") -> Run:
        return run_ctx(*args, env=env, input=input, user=user)

    root = home / ".local/share/cortexfs/storage/current"
    boot = ok(as_user("bootstrap"))
    assert f"{root} {NOEXEC_WORDS}" in boot.out + boot.err, boot
    assert root.stat().st_uid == user.uid
    ok(as_user("queue", "init", "--project", "mine"))
    request = {"name": "me", "label": "me_t", "tools": ["fs.stat"]}
    ok(as_user("agent", "create", "-", input=json.dumps(request)))
    grant(root, root / "tool", "fs.stat", "me_t")
    line = refused(as_user("run", "--agent", "me", "fs.stat", "/ctx"), "EACCES", 126)
    assert "step 2" in line and NOEXEC_WORDS in line, line
    name = ok(as_user("queue", "publish", "--project", "mine", "-", input=json.dumps(STAT_JOB)))
    job = name.out.strip()
    worked = ok(as_user("queue", "work", "--project", "mine", "--agent", "me", "--drain"))
    assert f"failed  {job}" in worked.out, worked
    queue = root / "shared/mine/queue"
    assert requests_by_state(queue) == {job: ["failed"]}
    assert NOEXEC_WORDS in result_of(queue, "failed", job)["reason"]
    assert "max_loaded_tools=" in ok(as_user("tool", "tsh.config")).out
