"""The storage root and its queues on filesystems with unusual mount options (SPEC §1 R-1 …
R-5, §2 Q-1 … Q-9, §2.4, §3 W-1, §5 P-5, §6 T-5, T-8, docs/queue.md, docs/tools.md,
docs/multi-host.md, docs/policy.md): a root remounted read-only while a claim is held, a
``--queue`` directory on a filesystem of its own that turns read-only, a project's queue and
single state directories on filesystems of their own, a root mounted ``noexec`` or ``nosuid,
nodev``, a tmpfs with few inodes (``nr_inodes=``) under bootstrap, installs and a worker, root
paths holding spaces, a newline, an escape byte or bytes that are not UTF-8, one root reached
through a bind mount of itself, and tmpfs roots whose ``mode=``/``uid=`` differ from what
bootstrap makes.  Every filesystem is a real tmpfs or bind mount made for the test below
/tmp/<this file's stem>-<uid>/ and unmounted after it (lazily when a plain unmount fails)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    Run,
    clean_env,
    new_scratch_dir,
    requests_by_state,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts filesystems: needs root")
pytestmark = needs_root

TRACEBACK = "Traceback (most recent call last)"
AGENT = "ci"
STAT_JOB = {"tool": "fs.stat", "input": {"path": "/ctx"}}
STATES = ("pending", "claimed", "done", "failed")
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# Claim-order hints (docs/queue.md) of this test process, below its scratch directory.
CACHE = scratch_top(__file__) / f"cache-{os.getpid()}"

# ------------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module", autouse=True)
def _hint_cache() -> Iterator[None]:
    yield
    shutil.rmtree(CACHE, ignore_errors=True)


@pytest.fixture
def disks() -> Iterator[ScratchMounts]:
    made = ScratchMounts(new_scratch_dir(scratch_top(__file__)))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process to name as a lease holder (``--pid``); killed at teardown."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def env_for(root: Path | str | None = None, **extra: str) -> dict[str, str]:
    """No CTX_ setting but ``CTX_STORAGE`` (when given); claim-order hints kept in
    :data:`CACHE` rather than in root's /var/cache."""
    env = clean_env(XDG_CACHE_HOME=str(CACHE), **extra)
    if root is not None:
        env["CTX_STORAGE"] = str(root)
    return env


def run_ctx(*args: object, input: str | bytes = b"", env: dict[str, str], umask: int = -1) -> Run:
    """``ctx ARGS…`` as a real process; arguments may be ``str`` holding bytes that are not
    UTF-8 (surrogate escapes), which reach the command as those bytes."""
    proc = subprocess.run(
        [*CTX_ARGV, *(os.fspath(a) if isinstance(a, Path) else str(a) for a in args)],
        input=input.encode() if isinstance(input, str) else input,
        capture_output=True,
        env=env,
        timeout=120,
        umask=umask,
    )
    return Run(
        [str(a) for a in args],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def ctx(root: Path | str, *args: object, input: str | bytes = b"") -> Run:
    """``ctx ARGS…`` on the storage root ``root`` (``CTX_STORAGE``)."""
    return run_ctx(*args, input=input, env=env_for(root))


def on_queue(root: Path, queue: Path, command: str, *args: object, input: str = "") -> Run:
    """``ctx queue COMMAND --queue QUEUE ARGS…`` with ``root`` as the storage root."""
    return ctx(root, "queue", command, "--queue", queue, *args, input=input)


def ok(run: Run) -> Run:
    assert run.rc == 0 and TRACEBACK not in run.err, run
    return run


def refused(run: Run, code: str, rc: int = 1) -> str:
    """``run`` exited ``rc`` with a ``ctx: CODE: …`` line and no traceback; that line."""
    assert TRACEBACK not in run.err and TRACEBACK not in run.out, run
    assert run.rc == rc, run
    lines = [line for line in run.err.splitlines() if line.startswith(f"ctx: {code}: ")]
    assert lines, run
    return lines[-1]


def make_world(root: Path, tools: tuple[str, ...] = ("fs.stat",), queue: bool = True) -> Path:
    """The storage root ``root`` made whole (by ``queue init`` of project ``proj`` when
    ``queue``, else by ``ctx bootstrap``), and agent ``ci`` (uid nobody) allowed ``tools`` by
    both policies (P-6)."""
    ok(ctx(root, "queue", "init", "--project", "proj") if queue else ctx(root, "bootstrap"))
    request = {"name": AGENT, "label": f"{AGENT}_t", "tools": list(tools)}
    ok(ctx(root, "agent", "create", "-", input=json.dumps(request)))
    for tool in tools:
        with open(root / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {AGENT}_t tool:{tool} execute\n")
    return root


def batch(root: Path, count: int, *where: str, job: dict | None = None) -> list[str]:
    """``ctx queue publish --batch`` of ``count`` requests; the names printed."""
    line = json.dumps(job or STAT_JOB) + "\n"
    args = where or ("--project", "proj")
    made = ok(ctx(root, "queue", "publish", *args, "--batch", "-", input=line * count))
    assert len(made.lines()) == count, made
    return made.lines()


def publish(root: Path, name: str, job: dict | None = None, project: str = "proj") -> str:
    made = ok(
        ctx(root, "queue", "publish", "--project", project, "--name", name, "-",
            input=json.dumps(job or STAT_JOB))
    )  # fmt: skip
    return made.out.strip()


def drain(root: Path, *where: str) -> Run:
    return ctx(
        root, "queue", "work", *(where or ("--project", "proj")), "--agent", AGENT, "--drain"
    )


def consistent(root: Path, queue_args: tuple, queue: Path, expected: dict[str, str]) -> None:
    """Exactly ``expected`` on disk, one state each, with its whole evidence; ``inbox/``
    empty; status counts them so and ``recover --reconcile`` calls the queue consistent."""
    assert requests_by_state(queue) == {job: [state] for job, state in expected.items()}
    for job, state in expected.items():
        if state in ("done", "failed"):
            assert (queue / state / f"{job}.result").is_file(), job
        if state == "claimed":
            assert (queue / "lease" / job / "worker").is_file(), job
    assert os.listdir(queue / "inbox") == []
    status = ok(ctx(root, "queue", "status", *queue_args, "--json")).json()
    for state in STATES:
        assert status["counts"][state] == list(expected.values()).count(state), status
    assert (status["counts"]["incomplete"], status["counts"]["conflict"]) == (0, 0), status
    recovered = ok(ctx(root, "queue", "recover", *queue_args, "--reconcile", "--json"))
    assert recovered.json()["consistent"] is True, recovered


def free_inodes(disk: Path) -> int:
    return os.statvfs(disk).f_ffree


def leave_inodes(disks: ScratchMounts, disk: Path, left: int) -> None:
    """Remount the tmpfs ``disk`` so that exactly ``left`` inodes are free."""
    fs = os.statvfs(disk)
    disks.remount(disk, f"nr_inodes={fs.f_files - fs.f_ffree + left}")
    assert free_inodes(disk) == left


def hidden(directory: Path) -> set[str]:
    """Staging names an install may leave in a tier, less the lock file installs keep."""
    return {n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock"}


# ------------------------------------------------------------------------------ read-only


def test_a_root_remounted_read_only_with_a_claim_held_reads_all_and_writes_nothing(
    disks: ScratchMounts, holder: subprocess.Popen, tmp_path: Path
) -> None:
    """R-1, Q-1 … Q-6, §2.4, W-1, T-8, docs/queue.md ("a write refused because the filesystem
    is mounted read-only is EROFS saying so"): a tmpfs root remounted ``ro`` while one job is
    claimed by a live holder and one is pending.  Every reading command answers (exit 0, the
    claim and its holder shown, ``--json`` one document); every writing command is refused
    with EROFS, exit 1 (126 for a terminal-mode call), naming the read-only filesystem and
    'remount', ``--json`` errors as one object; once the holder is gone recover says EROFS
    and leaves the job as it is.  Nothing changed on disk; remounted read-write, recover
    requeues the job and one drain finishes both, each once."""
    disk = disks.tmpfs("disk", "size=32m,mode=0755")
    root = make_world(disk / "st")
    queue = root / "shared/proj/queue"
    jobs = batch(root, 2)
    first = ok(ctx(root, "queue", "claim", "--project", "proj", "--pid", holder.pid)).out.strip()
    (second,) = set(jobs) - {first}
    ok(ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx"))
    manifest = tool_manifest(tmp_path / "src", "hello.say", "#!/bin/sh\necho hi\n")
    before = snapshot(root)
    disks.remount(disk, "ro")

    q = ("--project", "proj")
    for args in (
        ["queue", "list", *q],
        ["queue", "recover", *q, "--dry-run"],
        ["session", "repair", AGENT, "default"],  # a whole last line: nothing to cut
        ["policy", "explain", AGENT, "tool:fs.stat", "execute"],
    ):
        ok(ctx(root, *args))
    status = ok(ctx(root, "queue", "status", *q, "--json")).json()
    assert (status["counts"]["pending"], status["counts"]["claimed"]) == (1, 1), status
    shown = ok(ctx(root, "queue", "show", *q, first, "--json")).json()
    assert shown["state"] == "claimed" and shown["holder"]["state"] == "alive", shown
    untouched = ok(ctx(root, "queue", "recover", *q, "--json")).json()
    assert [u["job"] for u in untouched["untouched"]] == [first], untouched
    assert "tool_result" in ok(ctx(root, "session", "show", AGENT)).out
    assert ok(ctx(root, "object", "which", "fs.stat")).out == f"{root}/tool/fs.stat\n"

    agent = json.dumps({"name": "x", "label": "x_t"})
    job = json.dumps(STAT_JOB)
    writes = [
        (1, ["queue", "publish", *q, "-"], job),
        (1, ["queue", "claim", *q, "--pid", holder.pid], ""),
        (1, ["queue", "finish", *q, first, "--ok", "-"], '{"n": 1}'),
        (1, ["queue", "finish", *q, first, "--error", "-"], '{"n": 1}'),
        (1, ["queue", "renew", *q, first, "--pid", holder.pid, "--ttl", "600"], ""),
        (1, ["queue", "work", *q, "--agent", AGENT, "--drain"], ""),
        (1, ["shared", "create", "team"], ""),
        (1, ["bootstrap"], ""),
        (1, ["object", "install", manifest, "--tier", "system"], ""),
        (1, ["agent", "create", "-"], agent),
        (126, ["run", "--agent", AGENT, "fs.stat", "/ctx"], ""),
    ]
    for rc, args, stdin in writes:
        line = refused(ctx(root, *args, input=stdin), "EROFS", rc)
        assert "read-only" in line.lower() and "remount" in line, line
    answer = ctx(root, "queue", "claim", *q, "--json")
    assert answer.rc == 1 and answer.json()["error"] == "EROFS", answer
    assert answer.json()["errno"] == 30 and second in answer.json()["message"], answer
    native = ctx(root, "run", "--agent", AGENT, "--native", "fs.stat", input='{"path": "/ctx"}')
    frame = json.loads(native.lines()[-1])
    assert native.rc == 1 and frame["error"]["error"] == "EROFS", native

    holder.kill()
    holder.wait()
    stuck = ctx(root, "queue", "recover", *q, "--json")
    assert stuck.rc == 1, stuck
    assert [(e["job"], e["error"]) for e in stuck.json()["errors"]] == [(first, "EROFS")], stuck
    assert "left as it is" in stuck.json()["errors"][0]["detail"], stuck
    assert snapshot(root) == before

    disks.remount(disk, "rw")
    requeued = ok(ctx(root, "queue", "recover", *q, "--json")).json()
    assert [r["job"] for r in requeued["requeued"]] == [first], requeued
    ok(drain(root))
    consistent(root, q, queue, {first: "done", second: "done"})


def test_a_queue_directory_on_its_own_filesystem_turned_read_only_and_back(
    disks: ScratchMounts, holder: subprocess.Popen
) -> None:
    """Q-1 … Q-6, §2.4 (``--queue DIR``), N-1, docs/queue.md: a queue made with ``--queue``
    on a tmpfs of its own, the storage root on another, writable one.  Read-only, the queue
    still answers status, list, show and a dry-run recover; publish, claim, finish, renew,
    a worker and the requeue of a dead holder's job are each refused with EROFS naming the
    queue's own directory, saying what stays as it was; read-write again, recover requeues
    the job, a drain finishes all three, and the worker's session is on the root's
    filesystem, the results on the queue's."""
    root = make_world(disks.tmpfs("rootfs", "size=32m,mode=0755") / "st")
    qdisk = disks.tmpfs("queuefs", "size=8m,mode=0755")
    queue = qdisk / "queue"
    ok(on_queue(root, queue, "init"))
    jobs = batch(root, 3, "--queue", str(queue))
    claimed = ok(on_queue(root, queue, "claim", "--pid", holder.pid)).out.strip()
    pending = set(jobs) - {claimed}
    assert len(pending) == 2, (jobs, claimed)
    before = snapshot(queue)
    disks.remount(qdisk, "ro")

    counts = ok(on_queue(root, queue, "status", "--json")).json()["counts"]
    assert (counts["pending"], counts["claimed"]) == (2, 1), counts
    assert ok(on_queue(root, queue, "recover", "--dry-run")).out
    for args, stdin, said in (
        (["publish", "-"], json.dumps(STAT_JOB), "nothing was published"),
        (["claim", "--pid", holder.pid], "", "nothing was claimed (job "),
        (["finish", claimed, "--ok", "-"], "{}", f"job {claimed} stays claimed"),
        (
            ["renew", claimed, "--pid", holder.pid, "--ttl", "600"],
            "",
            f"the lease on {claimed} is unchanged",
        ),
        (["work", "--agent", AGENT, "--drain"], "", str(queue)),
    ):
        line = refused(on_queue(root, queue, *args, input=stdin), "EROFS")
        assert f"{queue}/" in line and "read-only" in line and said in line, line
    holder.kill()
    holder.wait()
    stuck = on_queue(root, queue, "recover")
    assert stuck.rc == 1 and f"{claimed}: EROFS: " in stuck.out, stuck
    assert "left as it is" in stuck.out, stuck
    assert snapshot(queue) == before

    disks.remount(qdisk, "rw")
    assert f"requeue  {claimed}" in ok(on_queue(root, queue, "recover")).out
    ok(drain(root, "--queue", str(queue)))
    consistent(root, ("--queue", str(queue)), queue, dict.fromkeys(jobs, "done"))
    session = root / "home" / "65534" / "agent" / AGENT / "session" / "worker" / "events.jsonl"
    assert session.is_file()
    assert os.stat(session).st_dev != os.stat(queue / "done").st_dev


# ------------------------------------------------------------------------------ other filesystems


def test_a_projects_queue_on_its_own_noexec_filesystem_is_made_whole_and_drained(
    disks: ScratchMounts,
) -> None:
    """X-1, Q-1 … Q-6, W-1, N-1 ("the queue directory MAY live on a shared filesystem"), T-5:
    a project's ``shared/P/queue`` is the root of a tmpfs of its own, mounted ``noexec`` (a
    queue holds data only) with mode 3770 as ``ctx shared create`` makes it: ``queue init``
    makes its state directories there, status warns of nothing, and a worker drains the
    jobs, requests and results on the queue's filesystem."""
    root = make_world(disks.tmpfs("rootfs", "size=32m,mode=0755") / "st", queue=False)
    ok(ctx(root, "shared", "create", "team"))
    queue = root / "shared" / "team" / "queue"
    shutil.rmtree(queue)
    queue.mkdir()
    disks.tmpfs(queue, "size=8m,mode=3770,noexec")
    assert os.stat(queue).st_dev != os.stat(root).st_dev

    made = ok(ctx(root, "queue", "init", "--project", "team"))
    assert "ready" in made.out, made
    assert {p.name for p in queue.iterdir()} >= {"inbox", *STATES, "lease", "config"}
    status = ok(ctx(root, "queue", "status", "--project", "team", "--json")).json()
    assert status["owned_by_others"] == status["group_not_inherited"] == [], status
    jobs = batch(root, 3, "--project", "team")
    worked = ok(drain(root, "--project", "team"))
    assert worked.out.count("done ") == 3, worked
    consistent(root, ("--project", "team"), queue, dict.fromkeys(jobs, "done"))
    for job in jobs:
        assert os.stat(queue / "done" / f"{job}.result").st_dev == os.stat(queue).st_dev


def test_a_state_directory_on_another_filesystem_refuses_each_step_whole(
    disks: ScratchMounts, holder: subprocess.Popen
) -> None:
    """Q-1, Q-2, Q-4, Q-6, I-1, I-2, §2.4: a state directory that is a mount of its own
    cannot take a rename from its siblings (EXDEV).  With ``pending/``, then ``claimed/``,
    then ``done/`` on a tmpfs of its own, publish, claim and finish are each refused (exit 1,
    EXDEV naming the directory, no traceback) saying nothing was published, the job stays
    pending, the job stays claimed with no result; no temp file stays in ``inbox/`` and no
    empty ``claimed/J``; once unmounted, the same step succeeds."""
    root = disks.tmpfs("rootfs", "size=32m,mode=0755") / "st"
    ok(ctx(root, "queue", "init", "--project", "proj"))
    queue = root / "shared/proj/queue"
    q = ("--project", "proj")

    disks.tmpfs(queue / "pending", "size=1m,mode=2770")
    line = refused(ctx(root, "queue", "publish", *q, "-", input=json.dumps(STAT_JOB)), "EXDEV")
    assert f"{queue}/pending" in line and "nothing was published" in line, line
    assert "on another filesystem than the rest" in line, line  # why, and what mends it
    assert os.listdir(queue / "inbox") == os.listdir(queue / "pending") == []
    disks.unmount(queue / "pending")
    (job,) = batch(root, 1)

    disks.tmpfs(queue / "claimed", "size=1m,mode=2770")
    line = refused(ctx(root, "queue", "claim", *q, "--pid", holder.pid), "EXDEV")
    assert f"job {job} stays pending" in line, line
    assert os.listdir(queue / "claimed") == os.listdir(queue / "lease") == []
    assert requests_by_state(queue) == {job: ["pending"]}
    disks.unmount(queue / "claimed")
    assert ok(ctx(root, "queue", "claim", *q, "--pid", holder.pid)).out == f"{job}\n"

    disks.tmpfs(queue / "done", "size=1m,mode=2770")
    line = refused(ctx(root, "queue", "finish", *q, job, "--ok", "-", input="{}"), "EXDEV")
    assert f"job {job} stays claimed and no result of it was written" in line, line
    assert os.listdir(queue / "done") == os.listdir(queue / "inbox") == []
    disks.unmount(queue / "done")
    assert os.listdir(queue / "done") == []
    ok(ctx(root, "queue", "finish", *q, job, "--ok", "-", input="{}"))
    consistent(root, q, queue, {job: "done"})


def test_a_private_queue_on_its_own_filesystem_lists_no_group_warnings(
    disks: ScratchMounts,
) -> None:
    """§2.4 ``--queue DIR``, docs/queue.md ("A queue whose directory grants its group nothing
    (a private queue made with --queue) gives nothing either"; "a private queue has no group
    to give and lists none"): ``ctx queue init --queue`` under the usual umask 022 on a tmpfs
    of its own gives a queue whose group may not write in it, so no member of that group can
    publish, claim or recover there at all; ``status`` has no state directory to report for
    not giving the queue's group to what members make, nor has ``init`` of the queue it
    has just made."""
    root = disks.tmpfs("rootfs", "size=8m,mode=0755") / "st"
    queue = disks.tmpfs("queuefs", "size=4m,mode=0755") / "queue"
    made = run_ctx("queue", "init", "--queue", queue, env=env_for(root), umask=0o022)
    assert made.rc == 0 and "is not setgid" not in made.err, made
    assert os.stat(queue).st_mode & 0o020 == 0  # the group may not write in the queue
    status = run_ctx("queue", "status", "--queue", queue, "--json", env=env_for(root))
    assert status.rc == 0, status
    assert status.json()["group_not_inherited"] == [], status
    assert "is not setgid" not in status.err, status


# ------------------------------------------------------------------------------ noexec, nosuid


def test_a_root_mounted_noexec_refuses_every_call_naming_noexec_and_keeps_its_queue(
    disks: ScratchMounts,
) -> None:
    """T-5, P-5 step 2, W-1, docs/policy.md ("a tool on a filesystem mounted noexec is denied,
    as the kernel would refuse its exec"): on a root mounted ``noexec``, a terminal and a
    native call are refused (EACCES, step 2) naming noexec and what to do, policy explain
    says the same, and a worker finishes its job in ``failed/`` with that reason and exits
    0."""
    root = make_world(disks.tmpfs("noexec", "size=32m,mode=0755,noexec") / "st")
    terminal = ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx")
    line = refused(terminal, "EACCES", 126)
    assert "noexec" in line and "step 2" in line, line
    native = ctx(root, "run", "--agent", AGENT, "--native", "fs.stat", input='{"path": "/ctx"}')
    error = json.loads(native.lines()[-1])["error"]
    assert (native.rc, error["error"], error["step"]) == (1, "EACCES", 2), native
    assert "noexec" in error["message"], error
    warned = ctx(root, "bootstrap")  # what it leaves that agents cannot use, it says
    assert warned.rc == 0 and "mounted noexec" in warned.err + warned.out, warned
    explained = ctx(root, "policy", "explain", AGENT, "tool:fs.stat", "execute")
    assert explained.rc == 1 and "noexec" in explained.out, explained
    (job,) = batch(root, 1)
    worked = ok(drain(root))
    assert f"failed  {job}" in worked.out, worked
    result = json.loads((root / f"shared/proj/queue/failed/{job}.result").read_text())
    assert result["status"] == "error" and "noexec" in result["reason"], result


def test_an_agent_terminal_on_a_noexec_root_names_noexec_not_a_missing_tsh(
    disks: ScratchMounts,
) -> None:
    """A-1, H-1, R-5, T-5: ``ctx agent start`` on a root mounted ``noexec`` cannot run
    ``bin/tsh``; it is refused without a traceback, and the reason names the noexec mount.
    It must not send the administrator to ``ctx bootstrap`` for a tsh that is there: bootstrap
    has nothing to do on this root."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    root = make_world(disks.tmpfs("noexec", "size=32m,mode=0755,noexec") / "st", queue=False)
    assert (root / "bin" / "tsh").is_file()
    started = ctx(root, "agent", "start", AGENT, "--no-workspace")
    try:
        assert started.rc != 0 and TRACEBACK not in started.err, started
        assert "noexec" in started.err, started
        assert "is missing" not in started.err, started
    finally:
        if started.rc == 0:
            ctx(root, "agent", "stop", AGENT)


def test_a_root_mounted_nosuid_nodev_works_as_any_other(disks: ScratchMounts) -> None:
    """R-1, R-5, W-1, T-3: ``nosuid`` and ``nodev`` take nothing CortexFS needs: an agent's
    ``shell.exec`` runs as its uid, and a worker finishes its job in ``done/``."""
    root = make_world(
        disks.tmpfs("plain", "size=32m,mode=0755,nosuid,nodev") / "st", ("shell.exec",)
    )
    ran = ok(ctx(root, "run", "--agent", AGENT, "shell.exec", "id -u"))
    assert ran.out.strip() == "65534", ran
    (job,) = batch(root, 1, job={"tool": "shell.exec", "input": {"cmd": "echo hi"}})
    ok(drain(root))
    consistent(root, ("--project", "proj"), root / "shared/proj/queue", {job: "done"})


# ------------------------------------------------------------------------------ inodes


def test_few_inodes_bootstrap_install_agent_and_space_stop_whole_and_complete_later(
    disks: ScratchMounts, tmp_path: Path
) -> None:
    """R-5, T-8, A-3, X-1, docs/tools.md ("nothing was installed and nothing of this attempt
    is left: free space or inodes"): on a tmpfs of 60 inodes bootstrap stops with ENOSPC
    saying what it left and to run it again; given inodes (remount), it completes.  With
    none, then a few inodes free, an install, a reinstall and an agent create are each
    refused with ENOSPC saying nothing was installed (the previous version in place),
    leaving no staging name; with enough, each goes through.  A shared space cut short is
    kept as made and completed by running ``shared create`` again."""
    disk = disks.tmpfs("disk", "size=32m,mode=0755,nr_inodes=60")
    root = disk / "st"
    cut = ctx(root, "bootstrap")
    line = refused(cut, "ENOSPC")
    assert line.startswith(f"ctx: ENOSPC: bootstrap of {root} left ") and "again" in line, cut
    disks.remount(disk, "nr_inodes=4000")
    ok(ctx(root, "bootstrap"))

    manifest = tool_manifest(tmp_path / "src", "hello.say", "#!/bin/sh\necho hi\n")
    for previous in (False, True):
        for left in (0, 7, 40):
            leave_inodes(disks, disk, left)
            install = ctx(root, "object", "install", manifest, "--tier", "system")
            assert hidden(root / "tool") == set(), (left, install)
            if install.rc == 0:
                break
            line = refused(install, "ENOSPC")
            assert f"cannot install {root}/tool/hello.say" in line, line
            assert "nothing was installed" in line and "inodes" in line, line
            assert ("the previous version is still in place" in line) is previous, line
            assert (root / "tool/hello.say").exists() is previous
        else:
            pytest.fail("no inode count tried let the install through")
        assert ok(ctx(root, "object", "which", "hello.say")).out == f"{root}/tool/hello.say\n"

    for left in (0, 5, 40):
        leave_inodes(disks, disk, left)
        name = f"a{left}"
        made = ctx(root, "agent", "create", "-", input=json.dumps({"name": name, "label": "a_t"}))
        assert hidden(root / "agent") == set(), (left, made)
        if made.rc == 0:
            break
        assert "nothing was installed" in refused(made, "ENOSPC"), made
        assert not (root / "agent" / name).exists() and not (root / "agent" / f"{name}.d").exists()
    else:
        pytest.fail("no inode count tried let the agent create through")

    leave_inodes(disks, disk, 5)
    space = ctx(root, "shared", "create", "team")
    line = refused(space, "ENOSPC")
    assert "could not be completed" in line and "'ctx shared create team' again" in line, line
    disks.remount(disk, "nr_inodes=4000")
    ok(ctx(root, "shared", "create", "team"))
    ok(ctx(root, "queue", "status", "--project", "team"))


def test_a_worker_that_runs_out_of_inodes_stops_and_loses_nothing(disks: ScratchMounts) -> None:
    """W-1, Q-2 … Q-5, I-1, I-3, docs/workers.md: a drain on a root with six inodes to spare
    finishes jobs until a step finds no inode left, then stops (exit 1, ENOSPC, saying its
    filesystem has 0 inodes free and to free inodes); a job it claimed and could not finish
    stays claimed with no result, every other job is done or pending; with inodes back,
    recover requeues the held job and a second drain ends every job in ``done/`` once."""
    disk = disks.tmpfs("disk", "size=32m,mode=0755,nr_inodes=4000")
    root = make_world(disk / "st")
    queue = root / "shared/proj/queue"
    warm = batch(root, 1)
    ok(drain(root))  # the worker's session exists from now on
    jobs = batch(root, 8)
    leave_inodes(disks, disk, 6)
    stopped = drain(root)
    line = refused(stopped, "ENOSPC")
    assert "0 inodes free" in stopped.err and "free inodes" in line, stopped
    states = requests_by_state(queue)
    held = [j for j in jobs if states[j] == ["claimed"]]
    assert 0 < sum(states[j] == ["done"] for j in jobs) < len(jobs), (stopped, states)
    assert all(states[j] in (["done"], ["pending"], ["claimed"]) for j in jobs), states
    assert len(held) <= 1 and all(j in line for j in held), (stopped, states)
    assert not any((queue / "done" / f"{j}.result").exists() for j in held)
    assert os.listdir(queue / "inbox") == []

    disks.remount(disk, "nr_inodes=4000")
    recovered = ok(ctx(root, "queue", "recover", "--project", "proj", "--json")).json()
    assert [r["job"] for r in recovered["requeued"]] == held, recovered
    ok(drain(root))
    consistent(root, ("--project", "proj"), queue, dict.fromkeys([*warm, *jobs], "done"))


# ------------------------------------------------------------------------------ odd root paths

ODD_NAMES = {
    "space-newline-escape": "a b\nc\x1b[31mred",
    "not-utf8": os.fsdecode(b"bad\xff\xfename"),
}


@pytest.mark.parametrize("odd", list(ODD_NAMES.values()), ids=list(ODD_NAMES))
def test_a_root_below_an_odd_name_works_and_never_prints_it_raw(
    disks: ScratchMounts, odd: str
) -> None:
    """R-1, Q-1 … Q-5, W-1, T-8a, H-1: a root whose path holds a space, a newline and an
    escape sequence, or bytes that are not UTF-8, is bootstrapped, given an agent and a queue
    whose jobs a worker runs; ``--json`` gives the exact path (the bytes, for one that is not
    UTF-8), text output never carries the newline or the escape byte raw, and ``bin/ctxterm``
    finds the root it was written into."""
    root = disks.tmpfs("disk", "size=32m,mode=0755") / odd / "st"
    make_world(root)
    outputs: list[Run] = []

    def seen(run: Run) -> Run:
        outputs.append(ok(run))
        return run

    seen(ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx"))
    line = json.dumps(STAT_JOB) + "\n"
    published = seen(ctx(root, "queue", "publish", "--project", "proj", "--batch", "-",
                         input=line * 2))  # fmt: skip
    seen(drain(root, "--project", "proj", "--max-jobs", "1"))
    status = seen(ctx(root, "queue", "status", "--project", "proj", "--json")).json()
    assert os.fsencode(status["queue"]) == os.fsencode(root / "shared/proj/queue"), status
    assert (status["counts"]["done"], status["counts"]["pending"]) == (1, 1), status
    done = [j for j in published.lines() if (root / f"shared/proj/queue/done/{j}.result").exists()]
    assert len(done) == 1, published
    which = seen(ctx(root, "object", "which", "fs.stat", "--json")).json()
    assert os.fsencode(which["path"]) == os.fsencode(root / "tool/fs.stat"), which
    for args in (["queue", "status", "--project", "proj"], ["agent", "show", AGENT]):
        seen(ctx(root, *args))
    missing = ctx(root, "queue", "status", "--project", "nosuch")
    refused(missing, "ENOENT")
    outputs.append(missing)
    ctxterm = subprocess.run(
        [root / "bin" / "ctxterm", "nosuch"], capture_output=True, env=env_for(), timeout=60
    )
    err = ctxterm.stderr.decode("utf-8", "replace")
    assert ctxterm.returncode == 1 and "there is no agent 'nosuch'" in err, err
    assert "agent/nosuch" in err and TRACEBACK not in err, err

    for run in outputs:
        for text in (run.out, run.err):
            assert "\x1b" not in text and "\ufffd" not in text, run
            assert "\nc\x1b" not in text and "b\nc" not in text, run


@pytest.mark.parametrize("odd", list(ODD_NAMES.values()), ids=list(ODD_NAMES))
def test_the_command_a_refusal_suggests_acts_on_the_same_odd_root(
    disks: ScratchMounts, odd: str
) -> None:
    """R-1, §2.4 and the README ('ctx: ERRNO: what to do'): for a root whose path holds a
    newline and an escape byte, or bytes that are not UTF-8, given with ``--storage``, the
    command that ``queue status`` of a missing queue gives as the remedy, run by a shell as
    printed, makes the queue in that same root, and nothing elsewhere."""
    disk = disks.tmpfs("disk", "size=32m,mode=0755")
    root = disk / odd / "st"
    missing = run_ctx("--storage", root, "queue", "status", "--project", "nosuch", env=env_for())
    line = refused(missing, "ENOENT")
    suggested = re.search(r"'(ctx queue init --storage .* --project nosuch)'", line)
    assert suggested, line
    done = subprocess.run(
        ["bash", "-c", suggested.group(1)],
        capture_output=True,
        env=env_for(PATH=f"{REPO / '.venv' / 'bin'}:{PATH}"),
        timeout=60,
    )
    assert (root / "shared/nosuch/queue/pending").is_dir(), done
    assert os.listdir(disk) == [odd], os.listdir(disk)


# ------------------------------------------------------------------------------ bind mounts


def test_one_root_through_two_paths_keeps_one_queue(
    disks: ScratchMounts, holder: subprocess.Popen
) -> None:
    """R-1, Q-1 … Q-6, I-4, docs/multi-host.md: a root on a tmpfs and a bind mount of that
    tmpfs are one queue under two paths: a name published through one is refused (EEXIST)
    through the other, a claim taken through one is seen alive and left alone by recover
    through the other, finished through the other, and status through either counts the same
    jobs; once the holder is gone recover through the first path requeues the other job."""
    disk = disks.tmpfs("a", "size=32m,mode=0755")
    first = disk / "st"
    ok(ctx(first, "queue", "init", "--project", "proj"))
    second = disks.bind(disk, "b") / "st"
    job = publish(first, "j1")
    again = ctx(second, "queue", "publish", "--project", "proj", "--name", "j1", "-",
                input=json.dumps(STAT_JOB))  # fmt: skip
    assert "already pending" in refused(again, "EEXIST"), again
    other = publish(second, "j2")
    q = ("--project", "proj")
    assert ok(ctx(second, "queue", "claim", *q, "--pid", holder.pid)).out == f"{job}\n"
    assert ok(ctx(first, "queue", "claim", *q, "--pid", holder.pid)).out == f"{other}\n"
    left = ok(ctx(first, "queue", "recover", *q, "--json")).json()
    assert sorted(u["job"] for u in left["untouched"]) == [job, other], left
    ok(ctx(first, "queue", "finish", *q, job, "--ok", "-", input="{}"))
    for root in (first, second):
        counts = ok(ctx(root, "queue", "status", *q, "--json")).json()["counts"]
        assert (counts["done"], counts["claimed"], counts["pending"]) == (1, 1, 0), counts
    holder.kill()
    holder.wait()
    assert f"requeue  {other}" in ok(ctx(first, "queue", "recover", *q)).out
    consistent(second, q, second / "shared/proj/queue", {job: "done", other: "pending"})


def test_an_agent_called_through_a_bind_mount_of_its_root_is_not_told_the_root_moved(
    disks: ScratchMounts,
) -> None:
    """R-1, P-5 step 3, docs/policy.md: an agent created through one path of a root, called
    through a bind mount of the same filesystem (the same directory, device and inode), either
    runs or is refused with a reason that does not claim the root is another one, moved or
    copied: editing the agent's mount as that reason says would take the first path away."""
    disk = disks.tmpfs("a", "size=32m,mode=0755")
    first = make_world(disk / "st", queue=False)
    second = disks.bind(disk, "b") / "st"
    assert os.stat(first)[1:3] == os.stat(second)[1:3]  # one directory: inode and device
    ok(ctx(first, "run", "--agent", AGENT, "fs.stat", "/ctx"))
    through = ctx(second, "run", "--agent", AGENT, "fs.stat", "/ctx")
    assert TRACEBACK not in through.err, through
    assert through.rc == 0 or "moved or copied" not in through.err, through


# ------------------------------------------------------------------------------ mode= and uid=


def test_a_root_tmpfs_of_mode_0700_is_named_by_bootstrap_and_by_every_call(
    disks: ScratchMounts,
) -> None:
    """R-5, P-5 step 2: a root that is a tmpfs mounted ``mode=0700`` closes it to every
    agent's uid: bootstrap warns, naming the root, its mode and ``chmod o+rx``, and leaves
    the mode as it is; a call is refused at step 2 naming the root; opened with ``chmod``,
    the same call runs."""
    root = disks.tmpfs("st", "size=32m,mode=0700")
    warned = ok(ctx(root, "bootstrap"))
    assert f"{root} (0700)" in warned.out and f"chmod o+rx {root}" in warned.out, warned
    assert os.stat(root).st_mode & 0o777 == 0o700
    make_world(root, queue=False)  # bootstrap again: the warning is not repaired away
    denied = ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx")
    line = refused(denied, "EACCES", 126)
    assert "step 2" in line and f"on {root} is denied to uid 65534" in line, line
    root.chmod(0o755)
    ok(ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx"))


def test_agent_create_warns_when_the_root_itself_is_closed_to_the_agent(
    disks: ScratchMounts,
) -> None:
    """A-3, P-5 step 2, docs/policy.md ("ctx agent create warns of one, and of a mount source
    the agent may not read and search"): the storage root is the source of the agent's
    ``/ctx`` mount; a root on a tmpfs of mode 0700 refuses every call of an agent running as
    nobody, so creating that agent warns that its calls will be refused, naming the root."""
    root = disks.tmpfs("st", "size=32m,mode=0700")
    ok(ctx(root, "bootstrap"))
    request = {"name": AGENT, "label": "ci_t", "tools": ["fs.stat"]}
    made = ctx(root, "agent", "create", "-", input=json.dumps(request))
    assert made.rc == 0, made
    warnings = [line for line in made.err.splitlines() if line.startswith("ctx: warning:")]
    assert any("refused" in w and str(root) in w for w in warnings), made


def test_a_world_writable_tmpfs_root_is_refused_by_bootstrap_until_chmod(
    disks: ScratchMounts,
) -> None:
    """R-5, docs/tools.md (host-owned controls): a tmpfs mounted without ``mode=`` is 1777;
    bootstrap, as a root there, makes what it can and exits 1 naming the root's mode and
    ``chmod go-w``; after that chmod it has nothing to do."""
    root = disks.tmpfs("st", "size=32m")
    assert os.stat(root).st_mode & 0o7777 == 0o1777
    first = ctx(root, "bootstrap")
    line = refused(first, "EACCES")
    assert f"{root} (mode 1777)" in line and f"chmod go-w {root}" in line, first
    assert {p.name for p in root.iterdir()} >= {"bin", "tool", "agent", "model", "home", "shared"}
    root.chmod(0o755)
    assert "nothing to do" in ok(ctx(root, "bootstrap")).out


def test_a_tmpfs_root_owned_by_another_uid_is_bootstrapped_for_that_uid(
    disks: ScratchMounts, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1, R-4, R-5: a root that is a tmpfs mounted ``uid=U,gid=G`` belongs to that user:
    root's bootstrap gives the six root entries it makes to that uid, never leaving one to
    root; the user's own bootstrap then has nothing to do, and the user works a queue there."""
    user = unprivileged_user
    root = disks.tmpfs("st", f"size=32m,mode=0755,uid={user.uid},gid={user.gid}")
    ok(ctx(root, "bootstrap"))
    for entry in ("bin", "tool", "agent", "model", "home", "shared"):
        assert (root / entry).stat().st_uid == user.uid, entry

    def as_user(*args: str, stdin: str = "") -> Run:
        done = subprocess.run(
            [*CTX_ARGV, "--storage", str(root), *args],
            input=stdin, capture_output=True, text=True, timeout=60,
            user=user.uid, group=user.gid, extra_groups=[], cwd="/",
            env={"PATH": PATH, "HOME": "/nonexistent"},
        )  # fmt: skip
        return Run(list(args), done.returncode, done.stdout, done.stderr)

    assert "nothing to do" in ok(as_user("bootstrap")).out
    ok(as_user("queue", "init", "--project", "mine"))
    job = ok(as_user("queue", "publish", "--project", "mine", "-", stdin=json.dumps(STAT_JOB)))
    claimed = ok(as_user("queue", "claim", "--project", "mine", "--pid", "1"))
    assert claimed.out == job.out, claimed
