"""End-to-end flows of what a user meets when things go wrong (SPEC §2 Q-1 … Q-8, I-1 … I-5,
§4 S-5, §6 T-8, R-5): a storage root on a small tmpfs that fills up and is then freed, the same
root remounted read-only, ``ctx`` processes SIGKILLed in the middle of a batch publish, a
bootstrap, an install and a session repair, and state damaged by hand (a truncated lease, a
request replaced by a FIFO or a directory, an illegal name, a garbage ``queue/config``, torn
lines in ``events.jsonl``).  Every bad input is refused with an errno-style error naming what,
nothing is left half-done under a final name, and everything works again once the cause is
gone."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.support.storage import small_tmpfs

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounts a tmpfs and runs agents as another uid: needs root"
)

STATES = ("inbox", "pending", "claimed", "lease", "done", "failed")
STAT_JOB = {"tool": "fs.stat", "input": {"path": "/ctx"}}

# ------------------------------------------------------------------------------ helpers


def ctx(root: Path, *args, input: str | bytes | None = None, timeout: float = 60) -> Run:
    return ctx_run(*args, input=input, env=clean_env(CTX_STORAGE=str(root)), timeout=timeout)


def make_world(top: Path) -> Path:
    """A bootstrapped storage root at ``top/st`` with agent ``ci`` (uid nobody) allowed
    ``fs.stat`` by both policies (P-6), and the queue of project ``proj``."""
    root = top / "st"
    assert ctx(root, "bootstrap").rc == 0
    make_agent(root, ["fs.stat"])
    allow_in_tool_policy(root, "fs.stat")
    assert ctx(root, "queue", "init", "--project", "proj").rc == 0
    return root


def session_dir(root: Path, session: str) -> Path:
    uid = pwd.getpwnam("nobody").pw_uid
    return root / "home" / str(uid) / "agent" / AGENT / "session" / session


def events_in(root: Path, session: str) -> list[dict]:
    shown = ctx(root, "session", "show", AGENT, session, "--json")
    assert shown.rc == 0, shown
    return [json.loads(line) for line in shown.lines()]


def fill(disk: Path) -> None:
    """Write one file until the filesystem has no byte left."""
    fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 1 << 10, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0


def remount(disk: Path, how: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{how}", str(disk)], check=True)


def queue_tree(queue: QueueCLI) -> dict[str, list[str]]:
    return {state: sorted(os.listdir(queue.dir / state)) for state in STATES}


def without(tree: dict[str, tuple], prefix: str) -> dict[str, tuple]:
    """``tree`` less what lies under ``prefix`` and the empty lock files installs take."""
    return {
        k: v
        for k, v in tree.items()
        if not k.startswith(prefix) and not (k.endswith("/.install-lock") and v == ("file", b""))
    }


def jsonl(*requests: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


# ------------------------------------------------------------------------------ a full disk


@needs_root
def test_a_full_disk_refuses_every_writer_naming_what_and_all_works_once_space_is_freed(
    traversable, child
):
    """Q-1, Q-2, Q-4, I-2, R-5, T-8, S-5: on a full disk publish (single and ``--batch``),
    claim, finish, a tool call in a new session, a bootstrap repairing a damaged root and an
    install are each refused with ENOSPC naming what and what was (not) done; nothing appears
    under a final name; once space is freed the same commands succeed and recover finds the
    queue consistent."""
    with small_tmpfs(traversable / "disk", "16m") as disk:
        disk.chmod(0o755)
        root = make_world(disk)
        queue = QueueCLI(root, "proj")
        jobs = [queue.publish(STAT_JOB, name=f"j{n}") for n in range(3)]
        assert queue.claim("--pid", str(child.pid)) == jobs[0]
        # The root a user damaged: a core tool and the tsh config removed (R-5 repairs them).
        (root / "tool" / "fs.list").unlink()
        shutil.rmtree(root / "tool" / "fs.list.d")
        (root / "tool" / "tsh.d" / "config").unlink()
        manifest = tool_manifest(traversable / "src", "demo.hello", "#!/bin/sh\necho hello\n")
        fill(disk)
        before = snapshot(root)
        inbox = f"{queue.dir}/inbox refused: No space left on device (its filesystem has 0 bytes"

        single = queue.run("publish", "--name", "late", "-", input=json.dumps(STAT_JOB))
        batch = queue.run("publish", "--batch", "-", input=jsonl(STAT_JOB, STAT_JOB))
        claim = queue.run("claim", "--pid", str(child.pid))
        finish = queue.run("finish", jobs[0], "--ok", "-", input='{"answer": 1}')
        call = ctx(root, "run", "--agent", AGENT, "--session", "s2", "fs.stat", "/ctx")
        boot = ctx(root, "bootstrap")
        install = ctx(root, "object", "install", manifest, "--tier", "system")

        for publish in (single, batch):
            assert (publish.rc, publish.out) == (1, ""), publish
            assert publish.err.startswith(f"ctx: ENOSPC: cannot publish in queue {queue.dir}: ")
            assert inbox in publish.err and "nothing was published" in publish.err, publish
        assert (claim.rc, claim.out) == (1, ""), claim
        assert f"nothing was claimed (job {jobs[1]} stays pending)" in claim.err, claim
        assert finish.rc == 1 and finish.err.startswith("ctx: ENOSPC: cannot finish"), finish
        assert f"job {jobs[0]} stays claimed and no result of it was written" in finish.err
        assert call.rc == 126 and call.err.startswith("ctx: ENOSPC: "), call
        assert "the tool did not run" in call.err, call
        assert boot.rc == 1, boot
        assert boot.err.startswith(f"ctx: ENOSPC: bootstrap of {root} left "), boot
        problems = [line for line in boot.lines() if line.startswith("problem")]
        assert any("tool/fs.list:" in line and "ENOSPC" in line for line in problems), boot
        assert any(line.startswith("problem   tool/tsh.d/config:") for line in problems), boot
        assert install.rc == 1, install
        assert install.err.startswith(f"ctx: ENOSPC: cannot install {root}/tool/demo.hello"), (
            install
        )
        assert "nothing was installed and nothing of this attempt is left" in install.err
        # Nothing half-made anywhere but the new session's (still empty) log.
        assert without(snapshot(root), "home/") == without(before, "home/")
        if session_dir(root, "s2").exists():
            assert (session_dir(root, "s2") / "events.jsonl").read_bytes() == b""

        (disk / "fill").unlink()

        repaired = ctx(root, "bootstrap")
        assert repaired.rc == 0, repaired
        assert "created   tool/fs.list\n" in repaired.out, repaired
        assert "created   tool/tsh.d/config\n" in repaired.out, repaired
        assert "nothing to do" in ctx(root, "bootstrap").out
        installed = ctx(root, "object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        assert ctx(root, "object", "which", "demo.hello").out == f"{root}/tool/demo.hello\n"
        called = ctx(root, "run", "--agent", AGENT, "--session", "s2", "fs.stat", "/ctx")
        assert called.rc == 0, called
        assert [e["type"] for e in events_in(root, "s2")] == ["tool_call", "tool_result"]
        late = queue.publish(STAT_JOB, name="late")
        more = queue.run("publish", "--batch", "-", input=jsonl(STAT_JOB, STAT_JOB))
        assert more.rc == 0 and len(more.lines()) == 2, more
        assert queue.claim("--pid", str(child.pid)) == jobs[1]
        queue.finish(jobs[0])
        queue.finish(jobs[1])
        assert queue.state(jobs[0]) == queue.state(jobs[1]) == "done"
        assert set(queue.entries("pending")) == {jobs[2], late, *more.lines()}
        recovered = queue.run("recover", "--reconcile")
        assert recovered.rc == 0 and "queue consistent" in recovered.out, recovered
        assert queue.entries("inbox") == set()


@needs_root
def test_a_call_refused_by_a_full_disk_names_the_session_file_it_could_not_write(traversable):
    """S-5, §6 stage ``session``: a call into a new session on a disk with no byte left (but
    inodes to spare) is refused with ENOSPC naming the session's events file, as the same call
    on a disk out of inodes names the session and one on a read-only disk names the file."""
    with small_tmpfs(traversable / "disk", "16m") as disk:
        disk.chmod(0o755)
        root = make_world(disk)
        fill(disk)

        call = ctx(root, "run", "--agent", AGENT, "--session", "s2", "fs.stat", "/ctx")

    assert call.rc == 126, call
    assert call.err.startswith("ctx: ENOSPC: "), call
    assert str(session_dir(root, "s2")) in call.err, call


# ------------------------------------------------------------------------------ read-only


@needs_root
def test_a_read_only_root_refuses_every_writer_with_erofs_while_readers_work(traversable, child):
    """Q-1 … Q-6, R-5, T-8, S-5: on a root remounted read-only every mutating command (queue
    transitions, recover of a dead holder's job, init, a space, a tool call, the worker,
    bootstrap, install, agent create) says EROFS and changes nothing, while status, list,
    show, session show and list, man, object list and which, and a repair with nothing torn
    still answer; remounted read-write, recover requeues what it could not."""
    with small_tmpfs(traversable / "disk", "16m") as disk:
        disk.chmod(0o755)
        root = make_world(disk)
        queue = QueueCLI(root, "proj")
        jobs = [queue.publish(STAT_JOB, name=f"j{n}") for n in range(3)]
        assert queue.claim("--pid", str(child.pid)) == jobs[0]
        gone = queue.run("claim", "--pid", "999999")  # a holder that is not running
        assert (gone.rc, gone.out) == (0, f"{jobs[1]}\n"), gone
        assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
        manifest = tool_manifest(traversable / "src", "demo.hello", "#!/bin/sh\necho hello\n")
        agent = traversable / "src" / "other.json"
        agent.write_text(json.dumps({"name": "other", "label": "other_t", "tools": []}))
        remount(disk, "ro")
        before = snapshot(root)
        pid = str(child.pid)

        writers = {
            "publish": queue.run("publish", "-", input=json.dumps(STAT_JOB)),
            "batch": queue.run("publish", "--batch", "-", input=jsonl(STAT_JOB)),
            "claim": queue.run("claim", "--pid", pid),
            "finish": queue.run("finish", jobs[0], "--ok", "-", input="{}"),
            "renew": queue.run("renew", jobs[0], "--pid", pid),
            "init": ctx(root, "queue", "init", "--project", "other"),
            "space": ctx(root, "shared", "create", "other"),
            "run": ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx"),
            "new session": ctx(root, "run", "--agent", AGENT, "--session", "s9", "fs.stat", "/"),
            "work": ctx(root, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain"),
            "bootstrap": ctx(root, "bootstrap"),
            "install": ctx(root, "object", "install", manifest, "--tier", "system"),
            "agent": ctx(root, "agent", "create", agent),
        }
        recover = queue.run("recover")
        reconcile = queue.run("recover", "--reconcile", "--json")

        for what, refused in writers.items():
            assert refused.rc in (1, 126), (what, refused)
            assert refused.err.startswith("ctx: EROFS: "), (what, refused)
            assert "read-only" in refused.err.lower(), (what, refused)
        assert "nothing was published" in writers["publish"].err
        assert f"nothing was claimed (job {jobs[2]} stays pending)" in writers["claim"].err
        assert "the tool did not run" in writers["run"].err
        assert writers["run"].err.startswith(f"ctx: EROFS: {session_dir(root, 's1')}/events.jsonl")
        assert "no job was claimed" in writers["work"].err
        assert recover.rc == 1, recover
        assert f"error    {jobs[1]}: EROFS: cannot requeue {jobs[1]}" in recover.out, recover
        assert "left as it is" in recover.out and f"untouched {jobs[0]}" in recover.out
        report = reconcile.json()
        assert reconcile.rc == 1 and report["consistent"] is False, reconcile
        assert [(e["job"], e["error"]) for e in report["errors"]] == [(jobs[1], "EROFS")]

        readers = {
            "status": queue.run("status"),
            "status json": queue.run("status", "--json"),
            "list": queue.run("list"),
            "show": queue.run("show", jobs[0]),
            "dry run": queue.run("recover", "--dry-run"),
            "session show": ctx(root, "session", "show", AGENT, "s1"),
            "session list": ctx(root, "session", "list", AGENT),
            "man": ctx(root, "man", "tool"),
            "object list": ctx(root, "object", "list"),
            "which": ctx(root, "object", "which", "fs.stat"),
            "repair": ctx(root, "session", "repair", AGENT, "s1"),
        }
        for what, answered in readers.items():
            assert answered.rc == 0 or (what == "dry run" and answered.rc == 1), (what, answered)
            assert answered.out and "EROFS" not in answered.err, (what, answered)
        counts = readers["status json"].json()["counts"]
        assert (counts["pending"], counts["claimed"], counts["conflict"]) == (1, 2, 0)
        assert readers["list"].lines() == [
            f"claimed    {jobs[0]}",
            f"claimed    {jobs[1]}",
            f"pending    {jobs[2]}",
        ]
        assert readers["man"].out.startswith("# ctx.tool")
        assert "fs.stat" in readers["object list"].out
        assert readers["which"].out == f"{root}/tool/fs.stat\n"
        assert "nothing to do" in readers["repair"].out
        assert snapshot(root) == before

        remount(disk, "rw")
        requeued = queue.run("recover")
        assert requeued.rc == 0 and f"requeue  {jobs[1]}" in requeued.out, requeued
        assert queue.state(jobs[1]) == "pending" and queue.state(jobs[0]) == "claimed"
        assert queue.run("publish", "-", input=json.dumps(STAT_JOB)).rc == 0
        assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
        assert len(events_in(root, "s1")) == 4


# ------------------------------------------------------------------------------ SIGKILL


def batch_lines(count: int) -> list[dict]:
    return [{"tool": "fs.stat", "input": {"n": n, "pad": "x" * 200}} for n in range(count)]


@pytest.mark.parametrize("moment", ["writing", "moving", "printing"])
def test_a_batch_publish_killed_midway_loses_no_printed_job_and_shows_nothing_half_made(
    queue, tmp_path, moment
):
    """Q-1, Q-5, Q-6, I-1, I-2, I-5: ``publish --batch`` of a large JSONL SIGKILLed while it
    writes its requests, while it moves them into ``pending/`` and once it prints names: every
    name it printed is pending; every pending request is one whole line of the batch, once;
    status lists the staging files as temps; recover leaves them, ``--reconcile --grace 0``
    removes them and a second run changes nothing; the queue then works as before."""
    lines = batch_lines(1200)
    source = tmp_path / "batch.jsonl"
    source.write_text(jsonl(*lines))
    argv = [*CTX_ARGV, "queue", "publish", "--project", queue.project, "--batch", str(source)]
    proc = subprocess.Popen(argv, env=clean_env(CTX_STORAGE=str(queue.storage)),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    printed: list[bytes] = []
    reader = threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        reached = {
            "writing": lambda: len(os.listdir(queue.dir / "inbox")) >= 200,
            "moving": lambda: len(os.listdir(queue.dir / "pending")) >= 1,
            "printing": lambda: bool(printed),
        }[moment]
        assert wait_for(lambda: reached() or proc.poll() is not None, seconds=30, step=0.002)
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
    names = [line.decode().strip() for line in printed if line.endswith(b"\n")]

    pending = queue.entries("pending")
    assert set(names) <= pending, (moment, len(names), len(pending))
    by_n = {}
    for job in pending:
        stored = json.loads((queue.dir / "pending" / job).read_text())
        n = stored["input"]["n"]
        assert stored["input"] == lines[n]["input"] and stored["tool"] == "fs.stat", job
        assert n not in by_n, (job, by_n[n])
        by_n[n] = job
    if moment == "writing":
        assert pending == set() and names == []
    temps = queue.entries("inbox")
    assert all(name.endswith(".publish.tmp") for name in temps), temps
    assert not {name.removesuffix(".publish.tmp") for name in temps} & pending

    status = queue.run("status", "--json")
    assert status.rc == 0, status
    report = status.json()
    assert report["pending"] == len(pending) and report["conflict"] == 0, report
    assert {t["path"] for t in report["temps"]} == {f"inbox/{t}" for t in temps}
    plain = queue.run("recover")
    assert plain.rc == 0 and queue.entries("inbox") == temps, plain
    swept = queue.run("recover", "--reconcile", "--grace", "0")
    assert swept.rc == 0 and "queue consistent" in swept.out, swept
    assert queue.entries("inbox") == set() and queue.entries("pending") == pending
    again = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert again.rc == 0 and again.json()["removed_temps"] == [], again

    if pending:
        claimed = queue.claim("--pid", str(os.getpid()))
        assert claimed in pending
        queue.finish(claimed)
        assert queue.state(claimed) == "done"
    assert queue.run("publish", "--batch", str(source)).rc == 0


def normalised(root: Path) -> dict[str, tuple]:
    """``snapshot(root)`` with the root's own path and the install time of each ``origin``
    taken out: what two bootstraps of the same version make alike."""
    tree = {}
    for rel, entry in snapshot(root).items():
        if entry[0] == "file":
            data = entry[1].replace(str(root).encode(), b"ROOT")
            if rel.endswith(".d/origin"):
                fields = json.loads(data)
                fields.pop("installed", None)
                data = json.dumps(fields, sort_keys=True).encode()
            entry = ("file", data)
        tree[rel] = entry
    return tree


def staging(rel: str) -> bool:
    """An entry an install works in before it commits (``tool/.NAME~…``)."""
    return any(part.startswith(".") and "~" in part for part in Path(rel).parts)


def test_a_bootstrap_killed_at_any_moment_shows_nothing_half_made_and_a_rerun_completes(
    tmp_path,
):
    """R-5, T-8, I-2: ``ctx bootstrap`` SIGKILLed at several moments leaves every visible
    entry exactly as a complete bootstrap makes it (only hidden staging entries may be left);
    the next bootstrap removes those and completes the root, the one after has nothing to do,
    and the result equals a bootstrap never interrupted."""
    reference = tmp_path / "reference"
    assert ctx_run("bootstrap", "--storage", reference).rc == 0
    expected = {k.replace(str(reference), "ROOT"): v for k, v in normalised(reference).items()}

    def entries(root: Path) -> int:
        return sum(len(d) + len(f) for _, d, f in os.walk(root)) if root.exists() else 0

    for number, threshold in enumerate((25, 65)):
        root = tmp_path / f"root{number}"
        proc = subprocess.Popen([*CTX_ARGV, "bootstrap", "--storage", str(root)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=clean_env())  # fmt: skip
        try:
            wait_for(
                lambda r=root, t=threshold, p=proc: entries(r) >= t or p.poll() is not None,
                20,
                0.001,
            )
        finally:
            proc.kill()
            proc.wait()
        cut = normalised(root) if root.exists() else {}

        rerun = ctx_run("bootstrap", "--storage", root)
        again = ctx_run("bootstrap", "--storage", root)

        assert rerun.rc == 0, (threshold, rerun)
        assert again.rc == 0 and "nothing to do" in again.out, (threshold, again)
        whole = normalised(root)
        assert whole == expected, (threshold, set(whole) ^ set(expected))
        for rel, entry in cut.items():
            if not staging(rel):
                assert entry == whole[rel], (threshold, rel)
        assert not [rel for rel in whole if staging(rel)]


def test_an_install_killed_while_it_replaces_a_tool_leaves_one_whole_version(tmp_path):
    """T-8, I-2: ``ctx object install`` replacing a tool with a large new version, SIGKILLed at
    several moments, leaves ``tool/NAME`` and its controls wholly the old version or wholly the
    new one, listed as available; the next install completes and leaves no staging behind."""
    root = tmp_path / "st"
    assert ctx(root, "bootstrap").rc == 0
    old = tool_manifest(tmp_path / "v1", "demo.big", "#!/bin/sh\necho one\n")
    new = tool_manifest(tmp_path / "v2", "demo.big", "#!/bin/sh\necho two\n")
    document = json.loads(new.read_text())
    document["description"] = "The second demo.big."
    new.write_text(json.dumps(document))
    with open(tmp_path / "v2" / "demo.big.sh", "a") as program:
        program.write(("#" * 1023 + "\n") * 50_000)  # 50 MB: the copy takes a while
    versions = {
        hashlib.sha256((tmp_path / v / "demo.big.sh").read_bytes()).hexdigest(): v
        for v in ("v1", "v2")
    }
    descriptions = {"v1": "The demo.big test tool.", "v2": "The second demo.big."}
    assert ctx(root, "object", "install", old, "--tier", "system").rc == 0
    tool = root / "tool" / "demo.big"

    for delay in (0.15, 0.25, 0.35, 0.5):
        proc = subprocess.Popen([*CTX_ARGV, "object", "install", str(new), "--tier", "system"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=clean_env(CTX_STORAGE=str(root)))  # fmt: skip
        time.sleep(delay)
        proc.kill()
        proc.wait()

        version = versions.get(hashlib.sha256(tool.read_bytes()).hexdigest())
        assert version is not None, (delay, tool.stat().st_size)
        listed = {o["name"]: o for o in ctx(root, "object", "list", "--json").json()}
        if (root / "tool" / ".demo.big~commit").exists():
            # Killed between the two swaps (the new controls beside the old entry): every
            # call refuses it (EAGAIN) until bootstrap or the next install finishes the
            # commit, and the listing says so (T-8).
            assert listed["demo.big"]["status"] == "unavailable", (delay, listed["demo.big"])
            assert "ctx bootstrap" in listed["demo.big"]["reason"], listed["demo.big"]
            continue
        description = (root / "tool" / "demo.big.d" / "description").read_text().strip()
        assert description == descriptions[version], (delay, version, description)
        assert listed["demo.big"]["status"] == "available", (delay, listed["demo.big"])
        assert listed["demo.big"]["description"] == descriptions[version]

    done = ctx(root, "object", "install", new, "--tier", "system")
    assert done.rc == 0, done
    assert versions[hashlib.sha256(tool.read_bytes()).hexdigest()] == "v2"
    assert [n for n in os.listdir(root / "tool") if n.startswith(".")] == [".install-lock"]


@needs_root
def test_a_session_repair_killed_midway_changes_nothing_and_the_next_one_cuts_the_torn_line(
    traversable,
):
    """S-5: ``ctx session repair`` SIGKILLed while it waits for an appender's lock, and at other
    moments, leaves the log either as it was or with exactly its torn last line cut; a repair
    run to its end cuts it, the next call appends whole events after it."""
    root = make_world(traversable)
    for _ in range(2):
        assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
    events = session_dir(root, "s1") / "events.jsonl"
    whole = events.read_bytes()
    torn = b'{"ts":"2026-12-01T00:00:00Z","type":"tool_call","agent":"ci","sess'
    with events.open("ab") as log:
        log.write(torn)
    argv = [*CTX_ARGV, "session", "repair", AGENT, "s1"]
    env = clean_env(CTX_STORAGE=str(root))

    with open(events, "rb") as appender:  # an append in flight holds the shared lock
        fcntl.flock(appender, fcntl.LOCK_SH)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()  # waiting for the lock
        proc.kill()
        proc.wait()
        fcntl.flock(appender, fcntl.LOCK_UN)
    assert events.read_bytes() == whole + torn

    for delay in (0.05, 0.15, 0.3):
        if events.read_bytes() == whole:
            with events.open("ab") as log:
                log.write(torn)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(delay)
        proc.kill()
        proc.wait()
        assert events.read_bytes() in (whole, whole + torn), delay

    repaired = ctx(root, "session", "repair", AGENT, "s1", "--json")
    assert repaired.rc == 0, repaired
    assert repaired.json()["truncated_bytes"] in (0, len(torn))
    assert events.read_bytes() == whole
    assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
    shown = events_in(root, "s1")
    assert [e["type"] for e in shown] == ["tool_call", "tool_result"] * 3
    assert events.read_bytes().startswith(whole) and events.read_bytes().endswith(b"\n")


# ------------------------------------------------------------------------------ damaged by hand


@needs_root
def test_a_queue_damaged_by_hand_is_reported_with_reasons_and_never_followed(traversable, child):
    """Q-6, Q-8, W-1: a truncated lease, a claimed request replaced by a FIFO, a pending request
    replaced by a directory and a request with an illegal name are listed by status as
    conflicts and ``ignored`` entries with their reasons; a draining worker runs only the
    sound jobs; recover reports and changes nothing; finish of the damaged lease is EINVAL
    naming it, and once the user repairs the lease the job finishes."""
    root = make_world(traversable)
    queue = QueueCLI(root, "proj")
    a, b, c, d, e = (queue.publish(STAT_JOB, name=n) for n in "abcde")
    assert queue.claim("--pid", str(child.pid)) == a
    assert queue.claim("--pid", str(child.pid)) == b
    lease = queue.dir / "lease" / a / "worker"
    saved = lease.read_bytes()
    lease.write_bytes(saved[: len(saved) // 2])
    request_b = queue.dir / "claimed" / b / b
    request_b.unlink()
    os.mkfifo(request_b)
    (queue.dir / "pending" / c).unlink()
    (queue.dir / "pending" / c).mkdir()
    bad = "bad:name.req.json"
    (queue.dir / "pending" / bad).write_text(json.dumps(STAT_JOB))

    def untouched_part() -> dict[str, tuple]:
        """The queue less the sound jobs d and e, which the worker is to run."""
        tree = snapshot(queue.dir)
        return {p: v for p, v in tree.items() if d not in p and e not in p}

    damaged = untouched_part()

    status = queue.run("status")
    assert status.rc == 1, status
    lines = status.lines()
    assert any(
        line.startswith(f"conflict   {a}: claimed, but lease/{a}/worker cannot be read (EINVAL")
        for line in lines
    ), status
    assert any(line.startswith(f"conflict   {b}: evidence of the wrong kind") for line in lines)
    assert f"ignored    claimed/{b}/{b}: a FIFO, not a regular file" in lines, status
    assert f"ignored    pending/{c}: a directory, not a request file" in lines, status
    assert any(line.startswith(f"ignored    pending/{bad}: illegal job name") for line in lines)
    listed = queue.run("list")
    assert listed.rc == 1 and f"conflict   {a}" in listed.lines(), listed

    worked = ctx(root, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
                 timeout=60)  # fmt: skip
    assert worked.rc == 0, worked
    assert queue.state(d) == queue.state(e) == "done"
    assert json.loads((queue.dir / "done" / f"{d}.result").read_text())["status"] == "ok"
    recovered = queue.run("recover", "--reconcile")
    assert recovered.rc == 1 and "2 conflicts" in recovered.out, recovered
    assert untouched_part() == damaged

    refused = queue.run("finish", a, "--ok", "-", input="{}")
    assert refused.rc == 1, refused
    assert refused.err.startswith(f"ctx: EINVAL: job {a}'s lease/{a}/worker is not a lease")
    assert "nothing was changed" in refused.err and queue.state(a) == "claimed"

    lease.write_bytes(saved)  # the user repairs the lease from what it held
    queue.finish(a)
    assert queue.state(a) == "done"
    (queue.dir / "pending" / c).rmdir()
    final = queue.run("status", "--json").json()
    assert (final["done"], final["conflict"], final["pending"]) == (3, 1, 0), final
    assert sorted(i["path"] for i in final["ignored"]) == [f"claimed/{b}/{b}", f"pending/{bad}"]


@needs_root
def test_finish_of_a_claim_whose_request_was_replaced_names_the_conflict(traversable, child):
    """Q-6, Q-8: a claimed job whose request a user replaced by a FIFO is a conflict for status,
    list and show; finish and renew refuse it naming that evidence, never "no such job"."""
    root = make_world(traversable)
    queue = QueueCLI(root, "proj")
    job = queue.publish(STAT_JOB, name="b")
    assert queue.claim("--pid", str(child.pid)) == job
    (queue.dir / "claimed" / job / job).unlink()
    os.mkfifo(queue.dir / "claimed" / job / job)
    assert queue.run("list").lines() == [f"conflict   {job}"]

    finish = queue.run("finish", job, "--ok", "-", input="{}", timeout=20)
    renew = queue.run("renew", job, "--pid", str(child.pid), timeout=20)

    for refused in (finish, renew):
        assert refused.rc == 1, refused
        assert "no such job" not in refused.err, refused
        assert f"claimed/{job}/{job}" in refused.err, refused
    assert os.path.exists(queue.dir / "lease" / job / "worker")


@needs_root
def test_a_garbage_queue_config_stops_every_command_until_it_is_fixed(traversable, child):
    """§2.1 ``queue/config``: a garbage line makes every queue command, readers and the worker
    included, refuse with EINVAL naming the file and the line; nothing is published, claimed,
    finished or recovered, the config is never replaced by defaults; fixed, all work again."""
    root = make_world(traversable)
    queue = QueueCLI(root, "proj")
    job = queue.publish(STAT_JOB, name="a")
    other = queue.publish(STAT_JOB, name="b")
    assert queue.claim("--pid", str(child.pid)) == job
    config = queue.dir / "config"
    good = config.read_bytes()
    line = good.count(b"\n") + 1
    config.write_bytes(good + b"\x00\xff garbage from an editor\n")
    damaged = snapshot(queue.dir)

    for args in (
        ("status",),
        ("show", job),
        ("publish", "--batch", "-"),
        ("claim", "--pid", str(child.pid)),
        ("finish", job, "--ok", "-"),
        ("recover", "--reconcile", "--grace", "0"),
        ("work", "--agent", AGENT, "--drain"),
        ("init",),
    ):
        refused = queue.run(*args, input=json.dumps(STAT_JOB))
        assert refused.rc == 1, (args, refused)
        assert refused.err.startswith(f"ctx: EINVAL: {config}:{line}: expected key=value"), (
            args,
            refused,
        )
    assert snapshot(queue.dir) == damaged

    config.write_bytes(good + b"lease_ttl=600\n")
    assert queue.run("status").rc == 0
    assert queue.claim("--pid", str(child.pid)) == other
    queue.finish(job)
    queue.finish(other)
    assert queue.state(job) == queue.state(other) == "done"


@needs_root
def test_torn_lines_in_the_middle_and_at_the_end_of_a_session_log(traversable):
    """S-5: a torn fragment ended by a newline in the middle is a damaged line readers skip and
    name; one glued onto the next event does not hide that event; a torn last line is skipped
    and noted, and ``repair`` cuts only it, never the middle; the next call appends whole
    lines and every event is read."""
    root = make_world(traversable)
    for _ in range(2):
        assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
    events = session_dir(root, "s1") / "events.jsonl"
    lines = events.read_bytes().splitlines(keepends=True)
    assert len(lines) == 4
    fragment = b'{"ts":"2026-12-01T00:00:00Z","type":"tool_call","agent":"ci","sess'
    damaged = lines[0] + fragment + b"\n" + lines[1] + fragment + lines[2] + lines[3]
    events.write_bytes(damaged + fragment)
    expected = [json.loads(line) for line in lines]

    shown = ctx(root, "session", "show", AGENT, "s1", "--json")
    assert shown.rc == 0, shown
    assert [json.loads(line) for line in shown.lines()] == expected
    assert f"ends with a torn line of {len(fragment)} bytes" in shown.err, shown
    assert f"skipped damaged lines 2 of {events}" in shown.err, shown
    text = ctx(root, "session", "show", AGENT, "s1")
    assert text.rc == 0 and len(text.lines()) == 4, text

    repaired = ctx(root, "session", "repair", AGENT, "s1", "--json")
    assert repaired.rc == 0 and repaired.json()["truncated_bytes"] == len(fragment), repaired
    assert events.read_bytes() == damaged
    again = ctx(root, "session", "repair", AGENT, "s1", "--json")
    assert again.rc == 0 and again.json()["truncated_bytes"] == 0, again
    assert events.read_bytes() == damaged

    assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
    after = events_in(root, "s1")
    assert after[:4] == expected and [e["type"] for e in after[4:]] == ["tool_call", "tool_result"]
    assert events.read_bytes().startswith(damaged) and events.read_bytes().endswith(b"\n")
