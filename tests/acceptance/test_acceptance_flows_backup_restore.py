"""An operator backs up a project's queue and space with ordinary tools (``cp -a``, ``tar`` with
and without ``--xattrs``/``--numeric-owner``, ``rsync -a`` where installed) while jobs are
pending, claimed by live holders, finished and failed, and restores it into a fresh storage
root or over the old one.  SPEC §2 (Q-1..Q-10, I-1..I-5), N-1 and X-1, and docs/queue.md:
the restored queue reads as it was backed up, ``recover`` judges every restored lease by the
liveness rules, and workers then drain it with nothing lost and nothing run twice."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    kill,
    request,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

METHODS = ["cp-a", "tar", "tar-xattrs-numeric", "rsync-a"]
TAR_KEEP = ["--xattrs", "--acls", "--numeric-owner"]
HOLD = "31.7"  # the seconds a held job sleeps: a token to find its stray process by
GROUP = 65534  # nogroup: the shared space's group
HOUR = 3600

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents and members need root")


# ------------------------------------------------------------------------------ helpers


def sh(*argv: str | os.PathLike) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)


def back_up(method: str, root: Path, where: Path) -> Path:
    """A backup of the storage root ``root`` made in ``where`` the way an operator would."""
    where.mkdir(parents=True, exist_ok=True)
    if method == "cp-a":
        sh("cp", "-a", root, where / "copy")
        return where / "copy"
    if method == "rsync-a":
        sh("rsync", "-a", f"{root}/", f"{where / 'copy'}/")
        return where / "copy"
    keep = TAR_KEEP if method == "tar-xattrs-numeric" else []
    sh("tar", *keep, "-C", root, "-cf", where / "backup.tar", ".")
    return where / "backup.tar"


def restore(method: str, backup: Path, root: Path) -> Path:
    """``backup`` put back at ``root`` (made when missing) by root, with the same tool."""
    root.mkdir(parents=True, exist_ok=True)
    if method == "cp-a":
        sh("cp", "-a", f"{backup}/.", root)
    elif method == "rsync-a":
        sh("rsync", "-a", f"{backup}/", f"{root}/")
    else:
        keep = TAR_KEEP if method == "tar-xattrs-numeric" else []
        sh("tar", *keep, "-C", root, "-xf", backup)
    return root


def without(document, *keys: str):
    """``document`` with every ``keys`` entry dropped at any depth (paths, inode numbers)."""
    if isinstance(document, dict):
        return {k: without(v, *keys) for k, v in document.items() if k not in keys}
    if isinstance(document, list):
        return [without(v, *keys) for v in document]
    return document


def to_seconds(document):
    """``document`` with every ``mtime`` cut to the second: GNU tar's default format keeps no
    more (``--xattrs`` makes it write the POSIX format, which keeps nanoseconds)."""
    if isinstance(document, dict):
        return {k: v[:19] if k == "mtime" else to_seconds(v) for k, v in document.items()}
    if isinstance(document, list):
        return [to_seconds(v) for v in document]
    return document


def views(queue: QueueCLI, jobs: list[str], method: str) -> dict:
    """What ``status``, ``list`` and ``show`` say of the queue, minus what a copy cannot keep
    (its path, inode numbers, and with plain tar the fractions of a second of an mtime); each
    command must exit 0 (no conflict)."""
    seen = {}
    for argv in [("status",), ("list",)] + [("show", job) for job in jobs]:
        r = queue.run(*argv, "--json")
        assert r.rc == 0, r
        seen[argv] = without(r.json(), "queue", "inode")
        if method == "tar":
            seen[argv] = to_seconds(seen[argv])
    return seen


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(finding["job"] for finding in report[key])


def recover_json(queue: QueueCLI, *args: str):
    r = queue.run("recover", "--json", *args)
    return r, r.json()


def process_with_pid(pid: int) -> subprocess.Popen | None:
    """A new, unrelated ``sleep`` that the kernel gives ``pid`` (the pid a dead holder had),
    by setting ``ns_last_pid`` as checkpoint/restore tools do; None where that is refused or
    another process keeps taking the pid first."""
    knob = Path("/proc/sys/kernel/ns_last_pid")
    for _ in range(50):
        try:
            knob.write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "600"])
        if proc.pid == pid:
            return proc
        kill(proc)
    return None


def kill_strays(*argv: str) -> None:
    """Kill every process whose command line is exactly ``argv`` (a job a killed worker left)."""
    wanted = "\0".join(argv) + "\0"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_text() == wanted:
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def rfc3339_to_epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def to_the_second(epoch: float) -> str:
    return datetime.fromtimestamp(math.floor(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ Q-1..Q-9


def test_a_backup_of_jobs_in_every_state_restores_to_the_same_queue(queue, child, tmp_path):
    """Q-1..Q-5, Q-9, I-5: a queue backed up (cp -a, tar, tar --xattrs --numeric-owner, rsync -a
    where installed) with pending, claimed (live holder), done and failed jobs reads the same
    after a restore into a fresh root (status, list, show); the restored lease of the live holder
    is left alone, and once the holder is gone it is requeued first in line (its publish time
    kept), --dry-run planning exactly what the run does, and claims follow publish order."""
    finished = queue.publish(request(tag="finished"), name="finished")
    broken = queue.publish(request(tag="broken"), name="broken")
    assert queue.claim("--pid", str(child.pid)) == finished
    queue.finish(finished)
    assert queue.claim("--pid", str(child.pid)) == broken
    queue.finish(broken, "--error")
    held = queue.publish(request(tag="held"), name="held")
    assert queue.claim("--pid", str(child.pid), "--worker", "backup-test") == held
    # Published in the reverse of their names' order: only publish times give this order.
    waiting = [queue.publish(request(tag=n), name=n) for n in ("zeta", "mid", "alpha")]
    shown = [finished, broken, held]
    methods = [m for m in METHODS if m != "rsync-a" or shutil.which("rsync")]
    restored = {}
    for method in methods:
        backup = back_up(method, queue.storage, tmp_path / method)
        restored[method] = QueueCLI(restore(method, backup, tmp_path / method / "root"), "proj")
    for method, copy in restored.items():
        before = views(queue, shown, method)
        assert before[("status",)]["counts"] == {
            "pending": 3, "claimed": 1, "done": 1, "failed": 1,
            "incomplete": 0, "conflict": 0, "ignored": 0,
        }  # fmt: skip
        assert snapshot(copy.dir) == snapshot(queue.dir), method
        assert views(copy, shown, method) == before, method
        # The holder still runs (same boot, same pid namespace, same start time): hands off.
        r, report = recover_json(copy, "--dry-run")
        assert r.rc == 0, r
        assert report["requeued"] == [] and jobs_in(report, "untouched") == [held], report

    copy = restored["tar-xattrs-numeric"]
    kept = snapshot(copy.dir)
    for args in ((), ("--reconcile",)):
        r, report = recover_json(copy, *args)
        assert r.rc == 0, r
        assert report["requeued"] == [] and jobs_in(report, "untouched") == [held], report
    assert snapshot(copy.dir) == kept
    assert copy.lease(held)["worker"] == "backup-test"

    kill(child)
    r, planned = recover_json(copy, "--dry-run")
    assert r.rc == 0, r
    assert jobs_in(planned, "requeued") == [held]
    assert [f["applied"] for f in planned["requeued"]] == [False]
    assert snapshot(copy.dir) == kept
    r, done = recover_json(copy)
    assert r.rc == 0, r
    assert jobs_in(done, "requeued") == [held]
    assert [f["applied"] for f in done["requeued"]] == [True]
    settled = snapshot(copy.dir)
    r, again = recover_json(copy, "--reconcile")
    assert r.rc == 0 and again["requeued"] == again["repaired"] == [], r
    assert snapshot(copy.dir) == settled

    # Q-9: publish times (the files' mtimes, to the nanosecond) came through the backup.
    me = str(os.getpid())
    assert [copy.claim("--pid", me) for _ in range(4)] == [held, *waiting]
    assert copy.run("claim", "--pid", me).rc == 3
    for job, state in ((finished, "done"), (broken, "failed")):
        assert copy.state(job) == state


# ------------------------------------------------------------------------------ Q-5 pid reuse


def test_a_restored_lease_whose_pid_another_process_now_has(queue, tmp_path):
    """Q-5 (docs/queue.md, Liveness): restored while an unrelated process has the dead
    holder's pid, a lease is requeued (another start time: pid reuse), while one that names a
    live process by its own start time (exact, or to the second) is never touched until that
    process is gone; --dry-run plans exactly the run's requeues."""
    holder = subprocess.Popen(["sleep", "600"])
    newcomer = None
    try:
        names = ("reused", "exact", "second", "rfc3339", "later")
        jobs = [queue.publish(request(tag=n), name=n) for n in names]
        for job in jobs:
            assert queue.claim("--pid", str(holder.pid)) == job
        backup = back_up("tar", queue.storage, tmp_path / "backup")
        time.sleep(0.1)  # the newcomer starts well over 0.05 s after the holder
        kill(holder)
        newcomer = process_with_pid(holder.pid)
        restored = QueueCLI(restore("tar", backup, tmp_path / "restored"), "proj")
        reused, exact, second, rfc, later = jobs
        if newcomer is None:  # no real pid reuse here: forge it, as the kernel would give it
            newcomer = subprocess.Popen(["sleep", "600"])
            lease = restored.lease(reused)
            restored.write_lease(reused, {**lease, "pid": newcomer.pid})
        assert restored.lease(reused)["pid"] == newcomer.pid
        started = psutil.Process(newcomer.pid).create_time()
        for job, times in (
            (exact, {"create_time": started}),
            (second, {"start_time": math.floor(started)}),
            (rfc, {"start_time": to_the_second(started)}),
            (later, {"create_time": started + 0.5}),
        ):
            lease = {k: v for k, v in restored.lease(job).items() if k != "create_time"}
            restored.write_lease(job, {**lease, "pid": newcomer.pid, **times})

        kept = snapshot(restored.dir)
        r, planned = recover_json(restored, "--dry-run")
        assert r.rc == 0, r
        assert snapshot(restored.dir) == kept
        assert jobs_in(planned, "requeued") == sorted([reused, later]), planned
        assert jobs_in(planned, "untouched") == sorted([exact, second, rfc]), planned
        r, done = recover_json(restored)
        assert r.rc == 0, r
        assert jobs_in(done, "requeued") == jobs_in(planned, "requeued")
        assert jobs_in(done, "untouched") == jobs_in(planned, "untouched")
        for job in (reused, later):
            assert restored.state(job) == "pending"
        shown = restored.run("show", exact, "--json")
        assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
        assert shown.json()["lease"]["pid"] == newcomer.pid

        kill(newcomer)
        r, done = recover_json(restored)
        assert r.rc == 0, r
        assert jobs_in(done, "requeued") == sorted([exact, second, rfc])
        assert {restored.state(job) for job in jobs} == {"pending"}
        assert restored.entries("claimed") == restored.entries("lease") == set()
    finally:
        for proc in (holder, newcomer):
            if proc is not None and proc.poll() is None:
                kill(proc)


# ------------------------------------------------------------------------------ I-1, I-3, W-3


@needs_root
def test_workers_drain_a_queue_restored_over_the_deleted_root_without_loss_or_rerun(
    storage, queue, agent, outbox
):
    """Q-5, I-1, I-3, W-3: backed up (tar --numeric-owner) while a worker runs one job and a
    shell's `ctx queue claim` holds another, the root is deleted and restored in place; recover
    requeues both dead holders' jobs (--dry-run planned the same), and two workers drain the
    rest: every job ends done or failed, and none that finished before the backup runs again."""
    ran = outbox / "ran"
    hold = outbox / "hold"
    hold.touch()
    first = queue.publish(shell_job(f"echo first >> {ran}"), name="first")
    broken = queue.publish(shell_job(f"echo broken >> {ran}; exit 1"), name="broken")
    r = queue.run("work", "--agent", AGENT, "--drain", "--max-jobs", "2", timeout=60)
    assert r.rc == 0, r
    assert (queue.state(first), queue.state(broken)) == ("done", "failed")

    slow_cmd = f"touch {outbox}/started; [ -e {hold} ] && sleep {HOLD}; echo slow >> {ran}"
    slow = queue.publish(shell_job(slow_cmd), name="slow")
    fast = [queue.publish(shell_job(f"echo f{i} >> {ran}"), name=f"f{i}") for i in range(1, 5)]
    env = clean_env(CTX_STORAGE=str(storage))
    argv = [*CTX_ARGV, "queue", "work", "-p", queue.project, "--agent", AGENT, "--max-jobs", "1"]
    worker = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    claimed_by = outbox / "claimed-by-shell"
    script = f'"$0" queue claim -p {queue.project} > {claimed_by}; exec sleep 600'
    shell = None
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 30), "the slow job never started"
        assert queue.state(slow) == "claimed"
        shell = subprocess.Popen(["sh", "-c", script, *CTX_ARGV], env=env)
        assert wait_for(lambda: claimed_by.exists() and claimed_by.read_text().strip(), 20)
        assert claimed_by.read_text().strip() == fast[0]
        archive = back_up("tar-xattrs-numeric", storage, outbox / "backup")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        kill_strays("sleep", HOLD)
        if shell is not None:
            kill(shell)

    shutil.rmtree(storage)
    restore("tar-xattrs-numeric", archive, storage)
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    counts = status.json()["counts"]
    assert (counts["pending"], counts["claimed"], counts["done"], counts["failed"]) == (3, 2, 1, 1)
    r, planned = recover_json(queue, "--dry-run")
    assert r.rc == 0, r
    assert jobs_in(planned, "requeued") == sorted([slow, fast[0]])
    r, done = recover_json(queue)
    assert r.rc == 0, r
    assert jobs_in(done, "requeued") == jobs_in(planned, "requeued")

    hold.unlink()
    argv = [*argv[:-2], "--drain"]
    workers = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(2)]  # fmt: skip
    for proc in workers:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    for job in (slow, *fast):
        assert queue.state(job) == "done", job
    assert (queue.state(first), queue.state(broken)) == ("done", "failed")
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert queue.entries(sub) == set(), sub
    assert sorted(ran.read_text().split()) == sorted(
        ["first", "broken", "slow", "f1", "f2", "f3", "f4"]
    )


# ------------------------------------------------------------------------------ Q-6 temps


def test_a_backup_taken_mid_publish_claim_and_finish_is_settled_by_recovers_rules(
    queue, child, tmp_path
):
    """Q-1, Q-3, Q-4, Q-6 (docs/queue.md, What a crash leaves): a backup that caught a
    publisher, a claimer and a finisher between their steps keeps their files' ages; after the
    restore a young publish temp holds its name (EEXIST) until the grace has passed, reconcile
    removes the old temps, returns the claim without a lease to pending, and leaves the
    interrupted finish of a live holder alone (exit 1) until that holder is gone, then rolls it
    forward; --dry-run first lists the same."""
    finishing = queue.publish(request(tag="finishing"), name="finishing")
    assert queue.claim("--pid", str(child.pid)) == finishing
    published = queue.publish(request(tag="published"), name="published")
    outcome = {"status": "ok", "output": {"answer": 42}, "worker": queue.lease(finishing)}
    (queue.dir / "done" / f"{finishing}.result").write_text(json.dumps(outcome))
    inbox = queue.dir / "inbox"
    young = inbox / "young.req.json.publish.tmp"
    young.write_text(json.dumps(request(tag="young")))
    old = inbox / "old.req.json.publish.tmp"
    old.write_text(json.dumps(request(tag="old")))
    midway = "midway.req.json"
    (queue.dir / "claimed" / midway).mkdir()
    (queue.dir / "claimed" / midway / midway).write_text(json.dumps(request(tag="midway")))
    lease_temp = inbox / f"{midway}.lease.0123456789ab.tmp"
    lease_temp.write_text(json.dumps({"job": midway, "pid": 1}))
    for path in (old, lease_temp, queue.dir / "claimed" / midway / midway):
        age(path, 2 * HOUR)
    age(queue.dir / "claimed" / midway, 2 * HOUR)

    archive = back_up("tar", queue.storage, tmp_path / "backup")
    restored = QueueCLI(restore("tar", archive, tmp_path / "restored"), "proj")
    status = restored.run("status", "--json")
    assert status.rc == 0, status
    report = status.json()
    assert sorted(e["job"] for e in report["incomplete"]) == sorted([finishing, midway]), report
    assert len(report["temps"]) == 3, report

    refused = restored.run("publish", "--name", "young", "-", input=json.dumps(request()))
    assert refused.rc == 1 and refused.err.startswith("ctx: EEXIST:"), refused
    assert "being published" in refused.err, refused
    plain = restored.run("recover")
    assert plain.rc == 1, plain  # plain recover only reports incomplete pairs
    kept = snapshot(restored.dir)
    r, planned = recover_json(restored, "--reconcile", "--dry-run")
    assert r.rc == 1, r
    assert snapshot(restored.dir) == kept
    stale = sorted(f"inbox/{p.name}" for p in (old, lease_temp))
    assert sorted(planned["stale_temps"]) == stale and planned["removed_temps"] == [], planned
    assert jobs_in(planned, "repaired") == [midway], planned
    assert jobs_in(planned, "incomplete") == [finishing], planned
    r, done = recover_json(restored, "--reconcile")
    assert r.rc == 1, r  # the live holder's interrupted finish remains
    assert sorted(done["removed_temps"]) == stale, done
    assert jobs_in(done, "repaired") == [midway]
    assert jobs_in(done, "incomplete") == [finishing]
    assert "alive" in json.dumps(done["incomplete"]), done
    assert restored.state(midway) == "pending"
    assert restored.entries("inbox") == {young.name}

    kill(child)
    r, done = recover_json(restored, "--reconcile")
    assert r.rc == 0 and jobs_in(done, "repaired") == [finishing], r
    assert restored.state(finishing) == "done"
    assert json.loads((restored.dir / "done" / f"{finishing}.result").read_text()) == outcome
    assert restored.run("publish", "--name", "young", "-", input=json.dumps(request())).rc == 1

    r, waited = recover_json(restored, "--reconcile", "--grace", "0")
    assert r.rc == 0 and waited["removed_temps"] == [f"inbox/{young.name}"], r
    again = restored.run("publish", "--name", "young", "-", input=json.dumps(request()))
    assert again.rc == 0 and again.out.strip() == "young.req.json", again
    assert restored.state(published) == "pending"
    assert restored.entries("inbox") == set() and restored.entries("claimed") == set()


# ------------------------------------------------------------------------------


def ctx_as_member(user: UnprivilegedUser, storage: Path, *args: str, stdin: str = ""):
    env = clean_env(CTX_STORAGE=str(storage), HOME="/nonexistent")
    env.pop("XDG_CACHE_HOME", None)
    return subprocess.run(
        [*CTX_ARGV, *args], input=stdin, user=user.uid, group=user.gid, extra_groups=[GROUP],
        umask=0o022, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def modes_and_groups(space: Path) -> dict[str, tuple[int, int, int]]:
    found = {}
    for path in [space, *space.rglob("*")]:
        st = path.lstat()
        found[str(path.relative_to(space))] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return found


@needs_root
def test_a_root_restore_of_a_shared_space_keeps_what_members_need_or_is_repaired(
    storage, traversable, unprivileged_user
):
    """X-1, Q-5 (docs/queue.md, A queue shared by a group): restored by root with tar keeping
    owners, the space keeps its group, setgid and sticky modes and a member works its queue at
    once; restored with a plain `cp -r` the member is refused (EACCES naming the directory,
    nothing changed) until `ctx shared create --group` repairs it."""
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("shared", "create", "--group", str(GROUP), "mp", env=env).rc == 0
    assert ctx_run("queue", "init", "-p", "mp", env=env).rc == 0
    member = unprivileged_user
    made = ctx_as_member(member, storage, "queue", "publish", "-p", "mp", "--name", "m1", "-",
                         stdin=json.dumps(request()))  # fmt: skip
    assert made.returncode == 0, made.stderr
    space = storage / "shared" / "mp"
    original = modes_and_groups(space)
    assert original["queue"][0] == 0o3770 and original["queue/pending"][0] == 0o2770
    assert original["queue/pending/m1.req.json"][1:] == (member.uid, GROUP)

    archive = back_up("tar-xattrs-numeric", storage, traversable / "backup")
    careful = restore("tar-xattrs-numeric", archive, traversable / "careful")
    assert modes_and_groups(careful / "shared" / "mp") == original
    status = ctx_run("queue", "status", "-p", "mp", "--json",
                     env=clean_env(CTX_STORAGE=str(careful)))  # fmt: skip
    assert status.rc == 0 and status.json()["owned_by_others"] == [], status
    for step in (
        ("queue", "publish", "-p", "mp", "--name", "m2", "-"),
        ("queue", "claim", "-p", "mp", "--pid", "1"),
        ("queue", "finish", "-p", "mp", "m1.req.json", "--ok", "-"),
    ):
        done = ctx_as_member(member, careful, *step, stdin=json.dumps(request()))
        assert done.returncode == 0, (step, done.stderr)

    careless = traversable / "careless"
    sh("cp", "-r", storage, careless)
    queue_dir = careless / "shared" / "mp" / "queue"
    lost = stat.S_IMODE(queue_dir.lstat().st_mode)
    assert queue_dir.lstat().st_gid != GROUP or lost != 0o3770
    before = snapshot(queue_dir)
    refused = ctx_as_member(member, careless, "queue", "publish", "-p", "mp", "--name", "m2", "-",
                            stdin=json.dumps(request()))  # fmt: skip
    assert refused.returncode == 1, refused
    # docs/queue.md: the refusal names the directory that refused, its owner, group and mode.
    said = refused.stderr
    assert said.startswith("ctx: EACCES:") and f"{careless}/shared/mp" in said, said
    assert "owner uid 0, group 0, mode " in said, said
    assert snapshot(queue_dir) == before

    repair = ctx_run("shared", "create", "--group", str(GROUP), "mp",
                     env=clean_env(CTX_STORAGE=str(careless)))  # fmt: skip
    assert repair.rc == 0, repair
    repaired = modes_and_groups(careless / "shared" / "mp")
    assert repaired["queue"][0] == 0o3770 and repaired["queue/pending"][0] == 0o2770
    assert {gid for _, _, gid in repaired.values()} == {GROUP}
    for step in (
        ("queue", "publish", "-p", "mp", "--name", "m2", "-"),
        ("queue", "claim", "-p", "mp", "--pid", "1"),
        ("queue", "finish", "-p", "mp", "m1.req.json", "--ok", "-"),
    ):
        done = ctx_as_member(member, careless, *step, stdin=json.dumps(request()))
        assert done.returncode == 0, (step, done.stderr)


# ------------------------------------------------------------------------------ N-1 link moves


def test_a_link_strategy_leftover_survives_only_a_backup_that_keeps_hard_links(queue, tmp_path):
    """N-1, Q-6 (docs/queue.md, What a crash leaves): with `move=link` a crash can leave
    `claimed/J/J` as a second link of `pending/J`; tar and cp -a keep the two names one file,
    so the restored queue reports the interrupted move and reconcile drops the claim link
    (back to exactly one pending request); a copy that splits the links (cp -r, rsync -a
    without -H) leaves two files, a conflict that is reported and never resolved."""
    with open(queue.dir / "config", "a") as config:
        config.write("move=link\n")
    job = queue.publish(request(tag="linked"), name="linked")
    claim = queue.dir / "claimed" / job
    claim.mkdir()
    os.link(queue.dir / "pending" / job, claim / job)
    for path in (claim / job, claim):
        age(path, 2 * HOUR)
    body = (queue.dir / "pending" / job).read_bytes()

    for method in ("tar", "cp-a"):
        backup = back_up(method, queue.storage, tmp_path / method)
        copy = QueueCLI(restore(method, backup, tmp_path / method / "root"), "proj")
        status = copy.run("status", "--json")
        assert status.rc == 0, (method, status)
        assert [e["job"] for e in status.json()["incomplete"]] == [job], (method, status)
        r, planned = recover_json(copy, "--reconcile", "--dry-run")
        assert r.rc == 1 and jobs_in(planned, "repaired") == [job], (method, r)
        r, done = recover_json(copy, "--reconcile")
        assert r.rc == 0 and jobs_in(done, "repaired") == [job], (method, r)
        assert copy.state(job) == "pending" and copy.entries("claimed") == set(), method
        assert (copy.dir / "pending" / job).read_bytes() == body
        assert copy.claim("--pid", str(os.getpid())) == job

    splitters = [("cp", "-r")] + ([("rsync", "-a")] if shutil.which("rsync") else [])
    for tool in splitters:
        split = tmp_path / f"split-{tool[0]}"
        sh(*tool, f"{queue.storage}/", split)
        copy = QueueCLI(split, "proj")
        assert (copy.dir / "pending" / job).stat().st_nlink == 1
        before = snapshot(copy.dir)
        for argv in (("status",), ("recover", "--reconcile")):
            r = copy.run(*argv, "--json")
            assert r.rc == 1, (tool, r)
            assert [c["job"] for c in r.json()["conflicts"]] == [job], (tool, r)
        assert snapshot(copy.dir) == before
        assert copy.run("claim", "--pid", str(os.getpid())).rc == 3


# ------------------------------------------------------------------------------ Q-5 expiry


def test_a_restored_copy_of_a_renewed_lease_expires_while_the_original_is_kept(
    queue, child, tmp_path
):
    """Q-5 (docs/queue.md, Liveness), §2.4 renew: a restored lease is a frozen copy: while the
    holder lives and renews its lease in the original queue, the restored copy's lease expires
    on schedule and recover requeues it there (an expired lease is proof, even with the pid
    alive), while the original keeps the job claimed."""
    job = queue.publish(request(tag="renewed"), name="renewed")
    assert queue.claim("--pid", str(child.pid), "--ttl", "2") == job
    backup = back_up("cp-a", queue.storage, tmp_path / "backup")
    copy = QueueCLI(restore("cp-a", backup, tmp_path / "root"), "proj")
    r, report = recover_json(copy)
    assert r.rc == 0 and jobs_in(report, "untouched") == [job], r
    renewed = queue.run("renew", job, "--pid", str(child.pid), "--ttl", "120")
    assert renewed.rc == 0, renewed
    expires = rfc3339_to_epoch(copy.lease(job)["expires_at"])
    assert wait_for(lambda: time.time() > expires + 0.2, 10)

    r, planned = recover_json(copy, "--dry-run")
    assert r.rc == 0 and jobs_in(planned, "requeued") == [job], r
    r, done = recover_json(copy)
    assert r.rc == 0 and jobs_in(done, "requeued") == [job], r
    assert copy.state(job) == "pending"
    r, original = recover_json(queue)
    assert r.rc == 0 and original["requeued"] == [], r
    assert jobs_in(original, "untouched") == [job]
    assert queue.state(job) == "claimed"
    assert queue.lease(job)["pid"] == child.pid
