"""Every prohibition of SPEC.md, tried: each sentence that says "never", "must not", "no …",
"only", "refuse" or "nothing … left" is turned into an attempt, through the ordinary commands
(and the mount and the standalone tsh where they apply), to make the product do the forbidden
thing anyway — a seventh root entry, evidence replaced, a live lease holder's job requeued, a
pid taken as proof across boots and namespaces, a link or FIFO followed or moved, a grant
from an install, a prompt or a leftover, a ``.tshrc`` or ``tsh.d/config`` run as code, a tool
run by a standalone tsh or by ``ctx tool``, an agent identity claimed by someone other than
the host administrator, an agent widening its own grants, a secret kept in a log.

Each test names the requirement it tries in its docstring.  Storage roots are copies of one
made by ``ctx bootstrap`` (the ``storage`` and ``searchable_storage`` fixtures); lease holders
are real processes; agents run as ``nobody``; the second uid is the unprivileged test user.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    ROOT_ENTRIES,
    SUFFIX,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    processes_of,
    request,
    result,
    scratch_top,
    serving,
    snapshot,
    tool_manifest,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as other uids, devices are made: needs root"
)

TOP = scratch_top(__file__)
CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


# --- small building blocks -----------------------------------------------------------------------


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = new_scratch_dir(TOP)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def live() -> Iterator[subprocess.Popen]:
    """A live process to stand in as a lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def env_of(storage: Path, **extra: str) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage), **extra)


def ctx(storage: Path, *args, **kw) -> Run:
    kw.setdefault("env", env_of(storage))
    return ctx_run(*args, **kw)


def errno_word(run: Run) -> str:
    """The errno word of ``ctx: ERRNO: …`` (or ``PROG: ERRNO: …``) on stderr."""
    for line in run.err.splitlines():
        parts = line.split(": ")
        if len(parts) >= 3 and parts[1].startswith("E") and parts[1].isupper():
            return parts[1]
    return ""


def claimed_for(queue: QueueCLI, name: str, pid: int) -> str:
    job = queue.publish(request(tag=name), name=name)
    assert queue.claim("--pid", str(pid)) == job
    return job


def recover(queue: QueueCLI, *args: str) -> Run:
    return queue.run("recover", "--json", *args)


def native(storage: Path, agent: str, tool: str, value: dict) -> tuple[int, dict]:
    """``ctx run --agent AGENT --native TOOL`` with ``value``: exit status and result frame."""
    r = ctx(storage, "run", "--agent", agent, "--native", tool, input=json.dumps(value))
    lines = r.out.splitlines()
    assert lines, r
    frame = json.loads(lines[-1])
    assert frame["type"] == "result", r
    return r.rc, frame


def frame_errno(frame: dict) -> str | None:
    """The errno a result frame carries: the chain's, else the one the tool's output names."""
    error = frame.get("error") or {}
    output = frame.get("output")
    if isinstance(output, dict) and output.get("error"):
        return output["error"]
    return error.get("error")


def make_agent(storage: Path, name: str, tools: list[str], **more) -> dict:
    req = {"name": name, "label": f"{name}_t", "tools": tools, **more}
    made = ctx(storage, "agent", "create", "-", "--json", input=json.dumps(req))
    assert made.rc == 0, made
    return made.json()


def grant_tool_side(storage: Path, label: str, *tools: str) -> None:
    for tool in tools:
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")


def marker_tool(directory: Path, name: str, marker: Path) -> Path:
    """A v2 manifest of tool ``name`` whose program leaves ``marker`` when it runs."""
    return tool_manifest(directory, name, f"#!/bin/sh\ntouch {marker}\ncat\n")


def root_entries(storage: Path) -> set[str]:
    return set(os.listdir(storage))


# --- §1: the root ABI, names, bootstrap ----------------------------------------------------------


def test_r2_no_command_adds_an_eighth_thing_to_the_root(storage: Path, scratch: Path) -> None:
    """R-2: "Nothing else may be created at the root: no mcp/, no audit/, no queue/, no
    registry."  Queue paths that would make one inside the storage root are refused (EINVAL,
    exit 2) before anything is made, and a day of ordinary commands (a space, an agent named
    like a forbidden entry, installs in every tier, a recover) leaves exactly six entries."""
    for option, path in [
        ("--queue", storage / "queue"),
        ("--queue", storage / "audit" / "queue"),
        ("--project", storage / "mcp" / "github"),
        ("--queue", storage / "shared" / "p" / ".." / ".." / "registry"),
    ]:
        refused = ctx(storage, "queue", "init", option, path)
        assert refused.rc == 2 and errno_word(refused) == "EINVAL", refused
        assert root_entries(storage) == ROOT_ENTRIES, refused

    assert ctx(storage, "shared", "create", "audit").rc == 0
    make_agent(storage, "mcp", ["fs.read"], shared={"audit": ["read"]})
    manifest = tool_manifest(scratch / "m", "registry", "#!/bin/sh\ncat\n")
    for tier in ("system", "user", "shared:audit"):
        installed = ctx(storage, "object", "install", manifest, "--tier", tier)
        assert installed.rc == 0, installed
    assert ctx(storage, "queue", "recover", "--project", "proj", "--reconcile").rc == 0
    assert root_entries(storage) == ROOT_ENTRIES
    assert (storage / "shared" / "audit" / "tool" / "registry").is_file()
    assert (storage / "agent" / "mcp").is_file()


def test_r2_a_bind_mount_of_the_root_is_still_the_root(storage: Path, scratch: Path) -> None:
    """R-2 and docs/queue.md ("Inside the storage root a queue path must be a project's
    queue"): the storage root reached at another path — here a bind mount of it, as a
    container host makes one — is still the storage root, and ``queue/`` may not be made at
    its top."""
    mounts = ScratchMounts(scratch / "m")
    try:
        alias = mounts.bind(storage, "alias")
        made = ctx(storage, "queue", "init", "--queue", alias / "queue")
        entries = root_entries(storage)
    finally:
        mounts.close()
        shutil.rmtree(storage / "queue", ignore_errors=True)
    assert made.rc == 2 and errno_word(made) == "EINVAL", made
    assert entries == ROOT_ENTRIES


@pytest.mark.parametrize(
    ("what", "argv"),
    [
        ("job with a space", ["queue", "publish", "--project", "proj", "--name", "a b", "-"]),
        ("job ..", ["queue", "publish", "--project", "proj", "--name", "..", "-"]),
        ("job dot-file", ["queue", "publish", "--project", "proj", "--name", ".j", "-"]),
        ("job 65 bytes", ["queue", "publish", "--project", "proj", "--name", "j" * 65, "-"]),
        ("space with a slash", ["shared", "create", "a/b"]),
        ("space ending in .d", ["shared", "create", "space.d"]),
    ],
)
def test_r3_an_illegal_object_name_is_einval_and_makes_nothing(
    storage: Path, what: str, argv: list[str]
) -> None:
    """R-3: names outside ``[A-Za-z0-9._-]{1,64}``, starting with a dot, or ending in ``.d``
    are "rejected with EINVAL" — and nothing is made under any name."""
    before = snapshot(storage)
    refused = ctx(storage, *argv, input=json.dumps(request()))
    assert refused.rc in (1, 2) and errno_word(refused) == "EINVAL", (what, refused)
    assert refused.out == ""
    assert snapshot(storage) == before


def test_r3_an_agent_request_with_an_illegal_name_creates_nothing(storage: Path) -> None:
    """R-3, A-3: ``ctx agent create`` of ``x.d`` (the control-directory suffix) or of a
    name with a slash is EINVAL, and neither ``agent/`` nor ``home/`` changes."""
    before = snapshot(storage)
    for name in ("coder.d", "../coder", "-coder"):
        req = {"name": name, "label": "coder_t", "tools": []}
        refused = ctx(storage, "agent", "create", "-", input=json.dumps(req))
        assert refused.rc in (1, 2) and errno_word(refused) == "EINVAL", (name, refused)
    assert snapshot(storage) == before


def test_r5_bootstrap_never_destroys_what_the_administrator_wrote(storage: Path) -> None:
    """R-5: bootstrap "is idempotent and never destroys user data": a grant added to a core
    tool's policy, a disabled core tool, a comment and a setting in ``tool/tsh.d/config``, a
    file of the administrator's in a control directory and in the docs bundle all survive a
    second ``ctx bootstrap``."""
    policy = storage / "tool" / "fs.read.d" / "policy"
    policy.write_text(policy.read_text() + "allow coder_t tool:fs.read execute\n")
    (storage / "tool" / "fs.write.d" / "status").write_text("disabled\n")
    config = storage / "tool" / "tsh.d" / "config"
    config.write_text("# ours: keep\nmax_loaded_tools=10\ncache_capacity=32\nwindow_percent=1\n")
    (storage / "tool" / "fs.read.d" / "notes.txt").write_text("ours\n")
    (storage / "shared" / "cortexfs-docs" / "local.md").write_text("ours\n")
    before = {p: p.read_bytes() for p in (policy, config)}

    again = ctx(storage, "bootstrap", "--storage", storage)
    assert again.rc == 0, again
    assert {p: p.read_bytes() for p in (policy, config)} == before
    assert (storage / "tool" / "fs.write.d" / "status").read_text().strip() == "disabled"
    assert (storage / "tool" / "fs.read.d" / "notes.txt").read_text() == "ours\n"
    assert (storage / "shared" / "cortexfs-docs" / "local.md").read_text() == "ours\n"


# --- publish never overwrites ---------------------------------------------------------------


def _plant(queue: QueueCLI, kind: str, job: str) -> None:
    d = queue.dir
    if kind == "lease only":
        (d / "lease" / job).mkdir()
        (d / "lease" / job / "worker").write_text("{}")
    elif kind == "empty claim directory":
        (d / "claimed" / job).mkdir()
    elif kind == "failed result only":
        (d / "failed" / f"{job}.result").write_text(json.dumps(result("failed")))
    elif kind == "done request only":
        (d / "done" / job).write_text(json.dumps(request(tag="old")))
    elif kind == "staging file of a publisher":
        (d / "inbox" / f"{job}.publish.tmp").write_text("half")


@pytest.mark.parametrize(
    "kind",
    [
        "lease only",
        "empty claim directory",
        "failed result only",
        "done request only",
        "staging file of a publisher",
    ],
)
def test_q1_publish_of_a_name_with_any_evidence_is_eexist_and_changes_nothing(
    queue: QueueCLI, kind: str
) -> None:
    """Q-1: "Publishing a name that already has evidence anywhere (pending, claimed, lease,
    done, failed) is refused (EEXIST), never overwritten" — also when the evidence is only
    one half of a state, or a publisher's staging file."""
    job = "twice" + SUFFIX
    _plant(queue, kind, job)
    before = snapshot(queue.dir)
    refused = queue.run("publish", "--name", "twice", "-", input=json.dumps(request()))
    assert refused.rc == 1 and errno_word(refused) == "EEXIST", refused
    assert refused.out == ""
    assert snapshot(queue.dir) == before


# --- nobody but the holder renews -----------------------------------------------------------


def test_q3_a_process_that_does_not_hold_the_lease_cannot_renew_it(
    queue: QueueCLI, live: subprocess.Popen
) -> None:
    """Q-3: "A worker MAY renew its own lease …; no other process renews leases."  This
    process, which did not take the lease (it was taken for ``live``), is refused with EACCES
    and the lease file stays byte for byte."""
    job = claimed_for(queue, "mine", live.pid)
    lease = queue.dir / "lease" / job / "worker"
    before = lease.read_bytes()
    refused = queue.run("renew", job, "--ttl", "9999")
    assert refused.rc == 1 and errno_word(refused) == "EACCES", refused
    assert lease.read_bytes() == before


# --- a live holder is never touched; a pid alone is never proof -----------------------


def test_q5_a_live_holder_keeps_its_job_through_recover_and_reconcile(
    queue: QueueCLI, live: subprocess.Popen
) -> None:
    """Q-5, Q-6: "Neither recover nor recover --reconcile ever touches a job whose lease
    holder is alive" — the claim, its lease and the queue stay as they were, exit 0."""
    job = claimed_for(queue, "busy", live.pid)
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",), ("--reconcile", "--grace", "0")):
        r = recover(queue, *args)
        assert r.rc == 0 and r.json()["requeued"] == [], r
        assert snapshot(queue.dir) == before
    assert queue.state(job) == "claimed"


def test_q6_reconcile_does_not_roll_forward_a_live_holders_result(
    queue: QueueCLI, live: subprocess.Popen
) -> None:
    """Q-6: a result beside a claimed request is rolled forward only by --reconcile and never
    while the lease holder is alive: the pair stays as it is, reported, exit 1."""
    job = claimed_for(queue, "half", live.pid)
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps(result()))
    before = snapshot(queue.dir)
    r = recover(queue, "--reconcile")
    assert r.rc == 1, r
    assert r.json()["repaired"] == [] and r.json()["requeued"] == [], r
    assert snapshot(queue.dir) == before


def test_q6_an_orphan_lease_of_a_live_holder_is_not_removed(
    queue: QueueCLI, live: subprocess.Popen
) -> None:
    """Q-6: "an orphan lease/J with no request anywhere in claimed → removed" — but never
    one whose holder is alive (docs/queue.md: "An orphan lease that names a live holder is
    left alone")."""
    job = claimed_for(queue, "orphan", live.pid)
    shutil.rmtree(queue.dir / "claimed" / job)
    before = snapshot(queue.dir)
    recover(queue, "--reconcile")
    assert snapshot(queue.dir) == before
    assert (queue.dir / "lease" / job / "worker").is_file()


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("another pid namespace", {"pid_ns": 4026531000}),
        ("another host", {"host": "elsewhere", "machine_id": "0" * 32, "boot_id": "0" * 32}),
        (
            "this host name on another machine",
            {"machine_id": "f" * 32, "boot_id": "12345678-0000-0000-0000-000000000000"},
        ),
    ],
)
def test_q5_a_dead_pid_is_no_proof_outside_this_boot_and_pid_namespace(
    queue: QueueCLI, where: str, change: dict
) -> None:
    """Q-5, N-1: "a pid alone is never proof across hosts or pid namespaces": an unexpired
    lease whose pid is dead *here* but which names another pid namespace, another host, or
    another machine of the same host name, is not requeued; ``show`` calls its holder
    ``unknown``."""
    job = claimed_for(queue, "far", dead_pid())
    lease = queue.lease(job)
    lease.update(change)
    lease["pid"] = dead_pid()
    queue.write_lease(job, lease)
    r = recover(queue, "--reconcile")
    assert r.rc == 0 and r.json()["requeued"] == [], (where, r)
    assert queue.state(job) == "claimed"
    shown = queue.run("show", job, "--json")
    assert shown.json()["holder"]["state"] == "unknown", (where, shown)


@pytest.mark.parametrize("field", ["boot_id", "pid_ns", "expires_at"])
def test_q5_a_lease_missing_what_would_make_its_pid_proof_is_never_requeued(
    queue: QueueCLI, field: str
) -> None:
    """Q-5: without ``boot_id`` or ``pid_ns`` nobody can tell which pid the lease names, and
    without ``expires_at`` it never expires: such a lease of a dead pid is a conflict for a
    person, never requeued (exit 1, the claim and lease untouched)."""
    job = claimed_for(queue, "bare", dead_pid())
    lease = queue.lease(job)
    del lease[field]
    queue.write_lease(job, lease)
    before = snapshot(queue.dir)
    r = recover(queue, "--reconcile")
    assert r.rc == 1 and r.json()["requeued"] == [], (field, r)
    assert snapshot(queue.dir) == before


def test_q5_a_live_holder_without_a_recorded_start_time_is_kept(
    queue: QueueCLI, live: subprocess.Popen
) -> None:
    """Q-5: a pid proves its holder gone only when it is dead or has *another* start time;
    a lease that records no start time names a live pid that cannot be proven reused, so its
    job is not requeued."""
    job = claimed_for(queue, "nostart", live.pid)
    lease = queue.lease(job)
    lease.pop("create_time", None)
    lease.pop("start_time", None)
    queue.write_lease(job, lease)
    r = recover(queue)
    assert r.rc == 0 and r.json()["requeued"] == [], r
    assert queue.state(job) == "claimed"


@pytest.mark.parametrize(
    "spelling",
    [BOOT_ID.upper(), BOOT_ID + "\n", ""],
    ids=["upper-case", "trailing-newline", "empty"],
)
def test_q5_a_live_holders_job_is_not_requeued_for_the_spelling_of_its_boot_id(
    queue: QueueCLI, live: subprocess.Popen, spelling: str
) -> None:
    """Q-5, Q-6: the holder is alive (its pid runs with the start time the lease records,
    the lease is unexpired); Q-3 defines ``boot_id`` as the content of
    ``/proc/sys/kernel/random/boot_id``.  A lease naming this boot as that file spells it (with
    its newline), or as the same UUID in upper case, or with no boot at all, is no proof
    of "the same host with another boot": recover must leave the job claimed."""
    job = claimed_for(queue, "spelt", live.pid)
    lease = queue.lease(job)
    lease["boot_id"] = spelling
    queue.write_lease(job, lease)
    r = recover(queue)
    assert r.json()["requeued"] == [], r
    assert queue.state(job) == "claimed"


@pytest.mark.parametrize("kind", ["pending and done", "claimed and done", "two results"])
def test_q6_a_conflict_is_reported_and_never_resolved(queue: QueueCLI, kind: str) -> None:
    """Q-6: "Anything else (e.g. J both pending and done, two results) is a conflict:
    reported with every piece of evidence, never resolved automatically" — by plain recover
    or --reconcile, exit 1, every byte left."""
    job = queue.terminal("twin") if kind != "two results" else "twin" + SUFFIX
    d = queue.dir
    if kind == "pending and done":
        (d / "pending" / job).write_text(json.dumps(request(tag="again")))
    elif kind == "claimed and done":
        (d / "claimed" / job).mkdir()
        (d / "claimed" / job / job).write_text(json.dumps(request(tag="again")))
    else:
        job = claimed_for(queue, "twin", dead_pid())
        (d / "done" / f"{job}.result").write_text(json.dumps(result("done")))
        (d / "failed" / f"{job}.result").write_text(json.dumps(result("failed")))
    before = snapshot(d)
    for args in ((), ("--reconcile", "--grace", "0")):
        r = recover(queue, *args)
        assert r.rc == 1 and r.json()["consistent"] is False, (kind, r)
        assert job in json.dumps(r.json()["conflicts"]), (kind, r)
        assert snapshot(d) == before, kind


def test_q6_plain_recover_reports_incomplete_pairs_and_changes_nothing(queue: QueueCLI) -> None:
    """Q-6: "plain recover reports it and changes nothing" — a claim without a lease, a
    result beside its claimed request, an empty claim directory and an orphan lease of a dead
    holder are each reported, exit 1, and the queue is byte for byte as it was."""
    d = queue.dir
    nolease = claimed_for(queue, "nolease", dead_pid())
    shutil.rmtree(d / "lease" / nolease)
    rolled = claimed_for(queue, "rolled", dead_pid())
    (d / "done" / f"{rolled}.result").write_text(json.dumps(result()))
    (d / "claimed" / ("empty" + SUFFIX)).mkdir()
    orphan = claimed_for(queue, "orphan", dead_pid())
    shutil.rmtree(d / "claimed" / orphan)
    before = snapshot(d)
    r = recover(queue)
    assert r.rc == 1, r
    assert r.json()["requeued"] == [] and r.json()["repaired"] == [], r
    reported = json.dumps(r.json()["incomplete"])
    for job in (nolease, rolled, "empty" + SUFFIX, orphan):
        assert job in reported, (job, r)
    assert snapshot(d) == before


def test_q6_a_temp_file_younger_than_the_grace_period_is_not_removed(queue: QueueCLI) -> None:
    """Q-6: only "stray temp files in inbox/ older than the grace period" are removed: one
    written just now stays through ``recover --reconcile`` (default grace, and --grace 30)."""
    temp = queue.dir / "inbox" / ("young" + SUFFIX + ".publish.tmp")
    temp.write_text('{"tool": "fs.read"')
    for args in (("--reconcile",), ("--reconcile", "--grace", "30")):
        r = recover(queue, *args)
        assert r.rc == 0 and r.json()["removed_temps"] == [], r
        assert temp.read_text() == '{"tool": "fs.read"'


# --- what is not a job is never followed, opened through a link or moved --------------------


def test_q8_links_fifos_devices_and_directories_in_pending_are_never_claimed_or_moved(
    queue: QueueCLI, scratch: Path
) -> None:
    """Q-8: symlinks and non-regular request files "are never followed, opened through a
    link, executed or moved; ctx queue status lists them as ignored with the reason".  A
    claim of a queue holding only a link to a valid request, a FIFO, a /dev/zero device and
    a directory finds nothing (exit 3, at once: the FIFO is not waited on, the device not
    read), recover --reconcile moves none of them, and the link's target is untouched."""
    target = scratch / "outside.json"
    target.write_text(json.dumps(request(tag="outside")))
    target_before = target.read_bytes()
    pending = queue.dir / "pending"
    (pending / ("link" + SUFFIX)).symlink_to(target)
    os.mkfifo(pending / ("fifo" + SUFFIX))
    os.mknod(pending / ("zero" + SUFFIX), 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    (pending / ("dir" + SUFFIX)).mkdir()
    before = snapshot(queue.dir)

    claim = queue.run("claim", timeout=20)
    assert claim.rc == 3 and claim.out == "", claim
    status = queue.run("status", "--json", timeout=20)
    ignored = json.dumps(status.json()["ignored"])
    for name in ("link", "fifo", "zero", "dir"):
        assert name + SUFFIX in ignored, (name, status)
    r = recover(queue, "--reconcile", "--grace", "0")
    assert r.rc == 0, r
    assert snapshot(queue.dir) == before
    assert target.read_bytes() == target_before


def test_q8_a_state_directory_swapped_for_a_link_is_not_written_through(
    queue: QueueCLI, scratch: Path, live: subprocess.Popen
) -> None:
    """Q-8: "a symlink swapped into the tree cannot redirect an operation outside the
    queue": with ``done/`` replaced by a link to an outside directory, finish is refused, the
    outside directory stays empty and the job stays claimed."""
    job = claimed_for(queue, "swap", live.pid)
    outside = scratch / "outside"
    outside.mkdir()
    (queue.dir / "done").rename(queue.dir / "done.real")
    (queue.dir / "done").symlink_to(outside)
    refused = queue.run("finish", job, "--ok", "-", input="{}")
    assert refused.rc == 1 and errno_word(refused) in ("ENOTDIR", "ELOOP"), refused
    assert list(outside.iterdir()) == []
    assert (queue.dir / "claimed" / job / job).is_file()
    assert list((queue.dir / "inbox").iterdir()) == []


def test_q8_a_lease_that_is_a_link_is_a_conflict_never_a_requeue(
    queue: QueueCLI, scratch: Path
) -> None:
    """Q-8: a lease file that is a symlink is not a lease: even pointing at a well-formed
    lease of a dead holder, it never requeues the job (a conflict, exit 1), and neither the
    link nor its target is changed."""
    job = claimed_for(queue, "linked", dead_pid())
    worker = queue.dir / "lease" / job / "worker"
    elsewhere = scratch / "lease.json"
    elsewhere.write_bytes(worker.read_bytes())
    worker.unlink()
    worker.symlink_to(elsewhere)
    before, target = snapshot(queue.dir), elsewhere.read_bytes()
    r = recover(queue, "--reconcile")
    assert r.rc == 1 and r.json()["requeued"] == [], r
    assert snapshot(queue.dir) == before and elsewhere.read_bytes() == target


# --- I-3, W-2 ------------------------------------------------------------------------------------


def test_i3_a_finished_job_never_returns_to_pending(
    queue: QueueCLI, live: subprocess.Popen
) -> None:
    """I-3: "After finish returned success, J is never executed again and never returns to
    pending": a copy of its request put back in ``claimed/J/`` without a lease (the shape
    --reconcile returns to pending) is a conflict with the terminal pair — left where it is —
    and no claim hands J out again."""
    job = claimed_for(queue, "over", live.pid)
    queue.finish(job)
    (queue.dir / "claimed" / job).mkdir()
    shutil.copy(queue.dir / "done" / job, queue.dir / "claimed" / job / job)
    r = recover(queue, "--reconcile", "--grace", "0")
    assert r.rc == 1 and r.json()["requeued"] == [] and r.json()["repaired"] == [], r
    assert not (queue.dir / "pending" / job).exists()
    assert queue.run("claim").rc == 3


def test_w2_q5_no_process_is_left_watching_after_drain_or_recover(
    searchable_storage: Path,
) -> None:
    """W-2, Q-5: "No background watcher and no polling service … there is no background
    watcher, no polling service": once ``ctx queue work --drain`` and ``ctx queue recover``
    have returned, no process naming the storage root is left running."""
    storage = searchable_storage
    make_agent(storage, "ci", ["shell.exec"])
    grant_tool_side(storage, "ci_t", "shell.exec")
    queue = QueueCLI(storage, "proj")
    job = queue.publish({**request("shell.exec"), "input": {"cmd": "true"}}, name="once")
    worked = ctx(
        storage, "queue", "work", "--storage", storage, "--project", "proj", "--agent", "ci",
        "--drain",
    )  # fmt: skip
    assert worked.rc == 0, worked
    assert queue.state(job) == "done"
    assert ctx(storage, "queue", "recover", "--storage", storage, "--project", "proj").rc == 0
    assert processes_of(storage) == []


# --- §4: logs and sessions -----------------------------------------------------------------------


def test_s3_s6_p6_no_audit_no_shared_control_no_tool_control(searchable_storage: Path) -> None:
    """S-3 ("There is no root audit/"), S-6 ("There is no agent/<name>.d/shared"), P-6
    ("There is no agent/<name>.d/tool"): an agent created with tools and a shared space, and
    a call it makes, leave neither."""
    storage = searchable_storage
    assert ctx(storage, "shared", "create", "team").rc == 0
    make_agent(storage, "ci", ["shell.exec"], shared={"team": ["read", "write"]})
    grant_tool_side(storage, "ci_t", "shell.exec")
    rc, frame = native(storage, "ci", "shell.exec", {"cmd": "true"})
    assert rc == 0, frame
    controls = set(os.listdir(storage / "agent" / "ci.d"))
    assert "shared" not in controls and "tool" not in controls, controls
    assert root_entries(storage) == ROOT_ENTRIES
    assert "allow ci_t shared:team write" in (storage / "agent" / "ci.d" / "policy").read_text()


def test_s4_no_log_keeps_a_secret_a_tool_printed(searchable_storage: Path) -> None:
    """S-4: "logs record facts and errors, not whole secrets": a tool that prints
    ``token=…`` on stderr and ``password: …`` on stdout, then fails, leaves the secret in no
    file of the storage root (session events, tool log, agent log) — though its caller gets
    the output."""
    storage = searchable_storage
    make_agent(storage, "ci", ["shell.exec"])
    grant_tool_side(storage, "ci_t", "shell.exec")
    secret = "s3cr3t-" + os.urandom(6).hex()
    encoded = base64.b64encode(secret.encode()).decode()
    cmd = (
        f"v=$(echo {encoded} | base64 -d); printf 'to''ken=%s\\n' \"$v\" >&2; "
        "printf 'pass''word: %s\\n' \"$v\"; exit 3"
    )
    rc, frame = native(storage, "ci", "shell.exec", {"cmd": cmd})
    assert rc == 1 and frame["exit_status"] == 3, frame
    assert secret in json.dumps(frame)  # the caller sees what the tool printed
    holding = [
        str(p)
        for p in storage.rglob("*")
        if p.is_file() and not p.is_symlink() and secret.encode() in p.read_bytes()
    ]
    assert holding == []


# --- §5: policy ----------------------------------------------------------------------------------


def test_p2_deny_globs_priorities_variables_templates_and_paths_are_einval(
    tmp_path: Path,
) -> None:
    """P-2: "No deny, no glob (*), no priority, no inheritance, no variables, no path
    matching, no templates.  allow coder_t agent:* create is invalid": each such line is one
    ``FILE:LINE: EINVAL`` of ``ctx policy check`` (exit 1), and a query over the file is exit
    2 with EINVAL, never an answer."""
    forbidden = [
        "deny coder_t tool:fs.read execute",
        "allow coder_t agent:* create",
        "allow * tool:fs.read execute",
        "allow coder_t tool:fs.read? execute",
        "allow coder_t tool:fs.{read,write} execute",
        "allow $SUBJ tool:fs.read execute",
        "allow coder_t tool:/ctx/tool/fs.read execute",
        "allow coder_t tool:fs.read execute priority=1",
        "allow coder_t model:openai/* use",
    ]
    policy = tmp_path / "p.policy"
    policy.write_text("\n".join([*forbidden, "allow coder_t tool:fs.read execute"]) + "\n")
    checked = ctx_run("policy", "check", policy)
    assert checked.rc == 1, checked
    lines = checked.err.splitlines()
    for number in range(1, len(forbidden) + 1):
        assert any(line.startswith(f"{policy}:{number}: EINVAL:") for line in lines), number
    assert not any(line.startswith(f"{policy}:{len(forbidden) + 1}:") for line in lines)
    query = ctx_run("policy", "query", "--policy", policy, "coder_t", "tool:fs.read", "execute")
    assert query.rc == 2 and "EINVAL" in query.err and query.out.strip() != "allow", query


def test_p2_a_glob_in_an_agents_policy_grants_nothing(searchable_storage: Path) -> None:
    """P-2: ``allow ci_t tool:* execute`` in the agent's policy does not let it run a tool
    granted on the tool's side only: explain says deny (exit 1) and a call is refused."""
    storage = searchable_storage
    make_agent(storage, "ci", [])
    with (storage / "agent" / "ci.d" / "policy").open("a") as policy:
        policy.write("allow ci_t tool:* execute\n")
    grant_tool_side(storage, "ci_t", "shell.exec")
    explained = ctx(storage, "policy", "explain", "ci", "tool:shell.exec", "execute")
    assert explained.rc == 1 and "deny" in explained.out, explained
    rc, frame = native(storage, "ci", "shell.exec", {"cmd": "true"})
    assert rc == 1 and frame["status"] == "error" and frame["exit_status"] is None, frame


def test_p6_a_system_prompt_never_grants(searchable_storage: Path) -> None:
    """P-6: "Prompts, system prompts and model output never grant permissions": allow lines
    in the agent's ``system.md`` and ``prompt.template.md`` give it no tool."""
    storage = searchable_storage
    make_agent(storage, "ci", [])
    grant_tool_side(storage, "ci_t", "shell.exec")
    rule = "allow ci_t tool:shell.exec execute\n"
    for control in ("system.md", "prompt.template.md"):
        (storage / "agent" / "ci.d" / control).write_text(rule)
    explained = ctx(storage, "policy", "explain", "ci", "tool:shell.exec", "execute")
    assert explained.rc == 1, explained
    rc, frame = native(storage, "ci", "shell.exec", {"cmd": "true"})
    assert rc == 1 and frame_errno(frame) == "EACCES" and frame["error"]["step"] == 5, frame


def test_p4_no_network_without_network_default_connect(searchable_storage: Path) -> None:
    """P-4: "without allow X network:default connect there is no network access": a tool of
    an agent without the rule cannot reach a listener on the host's 127.0.0.1 (the listener
    gets no connection); with the rule, the same call connects."""
    storage = searchable_storage
    make_agent(storage, "ci", ["shell.exec"])
    grant_tool_side(storage, "ci_t", "shell.exec")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        probe = (
            "python3 -c 'import socket,sys; "
            f'socket.create_connection(("127.0.0.1", {port}), 3); print("connected")\''
        )
        rc, frame = native(storage, "ci", "shell.exec", {"cmd": probe})
        assert rc == 1 and frame["exit_status"] != 0, frame
        with pytest.raises(TimeoutError):
            listener.accept()[0].close()

        with (storage / "agent" / "ci.d" / "policy").open("a") as policy:
            policy.write("allow ci_t network:default connect\n")
        rc, frame = native(storage, "ci", "shell.exec", {"cmd": probe})
        assert rc == 0 and "connected" in json.dumps(frame["output"]), frame
        listener.accept()[0].close()


# --- §6: installing grants nothing ---------------------------------------------------------------


def test_t8_installing_grants_nothing_whatever_the_manifest_says(
    storage: Path, scratch: Path
) -> None:
    """T-8: "Installing grants no agent any permission": a new tool's policy holds no rule,
    a manifest carrying a ``policy`` is refused (EINVAL) and installs nothing, and a ``cap``
    holding grant-like facts grants nothing."""
    manifest = tool_manifest(scratch, "hello", "#!/bin/sh\ncat\n")
    installed = ctx(storage, "object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed
    rules = (storage / "tool" / "hello.d" / "policy").read_text().splitlines()
    assert [r for r in rules if r.strip() and not r.lstrip().startswith("#")] == []

    document = json.loads(manifest.read_text())
    with_policy = {**document, "name": "hello2", "policy": "allow ci_t tool:hello2 execute"}
    (scratch / "hello2.json").write_text(json.dumps(with_policy))
    refused = ctx(storage, "object", "install", scratch / "hello2.json", "--tier", "system")
    assert refused.rc in (1, 2) and errno_word(refused) == "EINVAL", refused
    assert not (storage / "tool" / "hello2").exists()
    assert not (storage / "tool" / "hello2.d").exists()

    with_cap = {**document, "name": "hello3"}
    with_cap["cap"] = {"side_effects": False, "network": False, "grants": ["ci_t"]}
    (scratch / "hello3.json").write_text(json.dumps(with_cap))
    assert ctx(storage, "object", "install", scratch / "hello3.json", "--tier", "system").rc == 0
    query = ctx(
        storage, "policy", "query", "--policy", storage / "tool" / "hello3.d" / "policy",
        "ci_t", "tool:hello3", "execute",
    )  # fmt: skip
    assert query.rc == 1 and query.out.strip() == "deny", query


def test_t8_a_new_install_never_takes_a_removed_tools_grant_unsaid(
    storage: Path, scratch: Path
) -> None:
    """T-8 and docs/tools.md ("Removing a projected tool"): an administrator removed tool
    ``hello``'s executable (step one of the removal) and installs another program under that
    name before removing ``hello.d/``.  The install is taken for a reinstall, whose policy's
    grant then applies to the new program: installing grants nothing unsaid, so the install
    says so on stderr and in its JSON; once both are removed, the install is a new tool whose
    policy grants nothing."""
    first = tool_manifest(scratch / "v1", "hello", "#!/bin/sh\ncat\n")
    assert ctx(storage, "object", "install", first, "--tier", "system").rc == 0
    grant_tool_side(storage, "ci_t", "hello")
    (storage / "tool" / "hello").unlink()

    other = tool_manifest(scratch / "v2", "hello", "#!/bin/sh\necho something else\n")
    installed = ctx(storage, "object", "install", other, "--tier", "system", "--json")
    assert installed.rc == 0 and installed.json()["took_leftover_controls"] is True, installed
    assert "ctx: warning: " in installed.err and "without its executable" in installed.err

    def query() -> Run:
        return ctx(
            storage, "policy", "query", "--policy", storage / "tool" / "hello.d" / "policy",
            "ci_t", "tool:hello", "execute",
        )  # fmt: skip

    assert query().out.strip() == "allow"
    (storage / "tool" / "hello").unlink()
    shutil.rmtree(storage / "tool" / "hello.d")
    anew = ctx(storage, "object", "install", other, "--tier", "system", "--json")
    assert anew.rc == 0 and anew.json()["took_leftover_controls"] is False, anew
    assert "warning" not in anew.err
    assert query().rc == 1 and query().out.strip() == "deny"


# --- §7: tsh, .tshrc, tsh.d/config, ctx tool -----------------------------------------------------


def test_t4_a_tshrc_is_data_and_is_never_executed(storage: Path, scratch: Path) -> None:
    """T-4: "``.tshrc`` is data, never code": command lines, a command substitution as the
    value of CTX_PATH and backquotes in ``$CTX_HOME/.tshrc`` run nothing, for ``ctx object
    which`` and for a standalone tsh; each non-KEY=VALUE line is named in a warning."""
    home = scratch / "home"
    home.mkdir()
    marks = [scratch / f"mark{i}" for i in range(3)]
    (home / ".tshrc").write_text(
        f"touch {marks[0]}\nCTX_PATH=$(touch {marks[1]})\n`touch {marks[2]}`\n"
    )
    env = env_of(storage, CTX_HOME=str(home))
    which = ctx(storage, "object", "which", "fs.read", env=env)
    tsh = subprocess.run(
        [str(storage / "bin" / "tsh"), "which", "fs.read"], env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert [m for m in marks if m.exists()] == []
    assert which.rc == 1 and errno_word(which) == "ENOENT", which
    for said in (which.err, tsh.stderr):
        assert ".tshrc:1:" in said and ".tshrc:3:" in said, said
    assert tsh.returncode != 0


def test_h4_tsh_config_is_data_and_is_never_executed(storage: Path, scratch: Path) -> None:
    """H-4: "tool/tsh.d/config is data": a command substitution as a value, a command line
    and backquotes in it run nothing, for ``ctx tool tsh.config`` or for tsh; each is said
    to be ignored, the defaults apply."""
    marks = [scratch / f"mark{i}" for i in range(3)]
    config = storage / "tool" / "tsh.d" / "config"
    config.write_text(
        f"max_loaded_tools=$(touch {marks[0]})\ntouch {marks[1]}\n`touch {marks[2]}`\n"
    )
    shown = ctx(storage, "tool", "tsh.config")
    tsh = subprocess.run(
        [str(storage / "bin" / "tsh"), "tools"], env=env_of(storage), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert [m for m in marks if m.exists()] == []
    assert "max_loaded_tools=64" in shown.out, shown
    for line in (1, 2, 3):
        assert f"config:{line}:" in shown.err and f"config:{line}:" in tsh.stderr, line


def test_h1_h2_a_standalone_tsh_runs_no_host_command_and_no_tool_whatever_its_environment(
    searchable_storage: Path, scratch: Path
) -> None:
    """H-1: tsh "never runs host commands from PATH"; H-2: a standalone human tsh "cannot
    execute tools as an agent (it cannot forge agent identity)": host commands by name, by
    path and by a path climbing out of the root are not tools (exit 127); a tool both layers
    grant to agent ``ci`` is refused (exit 126) even with CTX_AGENT, CTX_SESSION and
    CTX_PATH set as an agent terminal sets them, and it never runs."""
    storage = searchable_storage
    mark = scratch / "ran"
    manifest = marker_tool(scratch / "m", "mark", mark)
    assert ctx(storage, "object", "install", manifest, "--tier", "system").rc == 0
    make_agent(storage, "ci", ["mark"])
    grant_tool_side(storage, "ci_t", "mark")
    tsh = str(storage / "bin" / "tsh")

    def run(*argv: str, **extra: str) -> subprocess.CompletedProcess:
        env = env_of(storage, **extra)
        return subprocess.run(
            [tsh, *argv], env=env, capture_output=True, text=True, timeout=60, input=""
        )

    for host_command in ("sh", "/bin/sh", "../../../../bin/sh", "id"):
        done = run(host_command, "-c", f"touch {mark}")
        assert done.returncode == 127, (host_command, done)
    forged = {"CTX_AGENT": "ci", "CTX_SESSION": "s1", "CTX_PATH": "/ctx/tool"}
    for env in ({}, forged):
        done = run("mark", **env)
        assert done.returncode in (126, 127), (env, done)
    assert not mark.exists()


@pytest.mark.parametrize("name", ["fs.write", "shell.exec", "fs.read", "agent.update", "mark"])
def test_h3_ctx_tool_refuses_every_tool_but_the_safe_core_clis(
    storage: Path, scratch: Path, name: str
) -> None:
    """H-3: ``ctx tool`` "MUST refuse ordinary visible tools and permission-bearing core
    tools": EACCES (exit 1), and an ordinary tool is never started."""
    mark = scratch / "ran"
    if name == "mark":
        manifest = marker_tool(scratch / "m", "mark", mark)
        assert ctx(storage, "object", "install", manifest, "--tier", "system").rc == 0
    refused = ctx(storage, "tool", name, "{}")
    assert refused.rc == 1 and errno_word(refused) == "EACCES", refused
    assert refused.out == ""
    assert not mark.exists()


def test_h3_ctx_tool_refuses_a_tool_that_shadows_tsh_config_on_ctx_path(
    storage: Path, scratch: Path
) -> None:
    """H-3 and ``ctx tool --help`` ("what it resolves to must be the core tool of the storage
    root's tool/ directory"): an executable ``tsh.config`` of the user's tier, first on
    CTX_PATH, is refused (EACCES) and never run."""
    mark = scratch / "ran"
    tier = storage / "home" / "0" / "tool"
    tier.mkdir(parents=True)
    shadow = tier / "tsh.config"
    shadow.write_text(f"#!/bin/sh\ntouch {mark}\n")
    shadow.chmod(0o755)
    (tier / "tsh.config.d").mkdir()
    env = env_of(storage, CTX_PATH=f"{tier}:{storage / 'tool'}")
    refused = ctx(storage, "tool", "tsh.config", env=env)
    assert refused.rc == 1 and errno_word(refused) == "EACCES", refused
    assert not mark.exists()


# --- §8: agents ----------------------------------------------------------------------------------


def test_a4_agent_create_never_widens_and_inherits_nothing(searchable_storage: Path) -> None:
    """A-4: the parent holds ``agent:<child> create``; "the child's permissions ⊆ the
    parent's"; its label is never another agent's; "nothing is inherited by default".  Each
    refusal is EACCES with nothing created; the child that is made holds exactly what it
    asked for."""
    storage = searchable_storage
    make_agent(storage, "other", [])
    make_agent(storage, "parent", ["agent.create", "fs.read", "fs.list"])
    grant_tool_side(storage, "parent_t", "agent.create", "fs.read", "fs.list")
    with (storage / "agent" / "parent.d" / "policy").open("a") as policy:
        policy.write("allow parent_t agent:kid create\n")

    attempts = [
        {"name": "kid", "label": "kid_t", "tools": ["fs.read", "shell.exec"]},
        {"name": "kid", "label": "other_t", "tools": ["fs.read"]},
        {"name": "kid2", "label": "kid2_t", "tools": ["fs.read"]},
    ]
    for attempt in attempts:
        rc, frame = native(storage, "parent", "agent.create", attempt)
        assert rc == 1 and frame_errno(frame) == "EACCES", (attempt, frame)
        assert not (storage / "agent" / attempt["name"]).exists()
        assert not (storage / "agent" / f"{attempt['name']}.d").exists()

    child = {"name": "kid", "label": "kid_t", "tools": ["fs.read"]}
    rc, frame = native(storage, "parent", "agent.create", child)
    assert rc == 0, frame
    rules = [
        line
        for line in (storage / "agent" / "kid.d" / "policy").read_text().splitlines()
        if line.startswith("allow ")
    ]
    label = (storage / "agent" / "kid.d" / "label").read_text().strip()
    assert sorted(rules) == sorted(
        [f"allow {label} tool:fs.read execute", f"allow {label} mount:ctx read"]
    ), rules
    assert root_entries(storage) == ROOT_ENTRIES


def test_a5_agent_update_touches_only_its_callers_prompt_files(searchable_storage: Path) -> None:
    """A-5: agent.update replaces exactly the caller's own ``system.md`` or
    ``prompt.template.md``; another control is EINVAL, a request naming another agent cannot
    reach it, over 8 KiB is refused; none of those changes any control of any agent."""
    storage = searchable_storage
    make_agent(storage, "other", [])
    make_agent(storage, "upd", ["agent.update"])
    grant_tool_side(storage, "upd_t", "agent.update")
    controls = {
        agent: {p.name: p.read_bytes() for p in (storage / "agent" / f"{agent}.d").iterdir()}
        for agent in ("upd", "other")
    }
    rule = "allow upd_t tool:shell.exec execute\n"
    for value in (
        {"control": "policy", "content": rule},
        {"control": "../other.d/system.md", "content": rule},
        {"control": "system.md", "content": rule, "agent": "other"},
        {"control": "system.md", "content": "é" * 4500},
    ):
        rc, frame = native(storage, "upd", "agent.update", value)
        assert rc in (1, 2) and frame_errno(frame) in ("EINVAL", "EFBIG"), (value, frame)
    for agent in ("upd", "other"):
        now = {p.name: p.read_bytes() for p in (storage / "agent" / f"{agent}.d").iterdir()}
        now.pop("log", None)
        assert now == {k: v for k, v in controls[agent].items() if k != "log"}, agent

    rc, frame = native(storage, "upd", "agent.update", {"control": "system.md", "content": "hi"})
    assert rc == 0, frame
    assert (storage / "agent" / "upd.d" / "system.md").read_text() == "hi"
    assert (storage / "agent" / "other.d" / "system.md").read_bytes() == controls["other"][
        "system.md"
    ]


def test_an_agent_cannot_widen_its_grants_by_writing_its_controls(
    searchable_storage: Path,
) -> None:
    """A-3, P-5 step 4, T-1: the controls belong to the host; an agent's own tool cannot
    append a grant to its policy, and a control made writable to others (so that it could)
    makes the chain refuse even the tool it was granted (EACCES at step 4)."""
    storage = searchable_storage
    make_agent(storage, "ci", ["shell.exec"])
    grant_tool_side(storage, "ci_t", "shell.exec")
    policy = storage / "agent" / "ci.d" / "policy"
    before = policy.read_bytes()
    widen = f"echo 'allow ci_t tool:fs.write execute' >> {policy}"
    rc, frame = native(storage, "ci", "shell.exec", {"cmd": widen})
    assert rc == 1 and frame["exit_status"] != 0, frame
    assert policy.read_bytes() == before

    policy.chmod(0o666)
    rc, frame = native(storage, "ci", "shell.exec", {"cmd": "true"})
    assert rc == 1 and frame_errno(frame) == "EACCES" and frame["error"]["step"] == 4, frame


def test_only_the_host_administrator_claims_an_agent_identity(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """P-5 step 1, H-2, docs/tools.md ("Only the host administrator may run tools as an
    agent"): another uid cannot run a tool as agent ``ci``, nor create an agent carrying
    ``ci``'s label — EACCES, nothing run, recorded or created."""
    storage = searchable_storage
    make_agent(storage, "ci", ["shell.exec"])
    grant_tool_side(storage, "ci_t", "shell.exec")
    before = snapshot(storage)
    env = env_of(storage, HOME="/")
    ran = run_as(
        unprivileged_user, [*CTX_ARGV, "run", "--agent", "ci", "--native", "shell.exec"],
        env=env, stdin='{"cmd": "true"}', cwd=Path("/"),
    )  # fmt: skip
    frame = json.loads(ran.stdout.splitlines()[-1])
    assert ran.returncode == 1 and frame_errno(frame) == "EACCES", ran
    assert frame["error"]["step"] == 1 and frame["exit_status"] is None, frame
    req = json.dumps({"name": "evil", "label": "ci_t", "tools": ["shell.exec"]})
    made = run_as(
        unprivileged_user, [*CTX_ARGV, "agent", "create", "-"], env=env, stdin=req, cwd=Path("/")
    )
    assert made.returncode == 1 and "EACCES" in made.stderr, made
    assert snapshot(storage) == before


# --- §10, §13: ctxmcp and the mount --------------------------------------------------------------


def test_m1_ctxmcp_writes_nothing_under_the_storage_root(storage: Path, scratch: Path) -> None:
    """M-1: ctxmcp "installs nothing, grants no policy, writes nothing under /ctx": an OUT in
    the storage root is EINVAL (exit 2) before the server is started and nothing is made."""
    mark = scratch / "started"
    config = scratch / "mcp.json"
    entry = {"command": "/bin/sh", "args": ["-c", f"touch {mark}"]}
    config.write_text(json.dumps({"mcpServers": {"srv": entry}}))
    before = snapshot(storage)
    for out in (storage / "tool" / "candidates", storage / "home" / "0" / "tool"):
        done = subprocess.run(
            [CTXMCP, "project", "--config", str(config), "--runtime-config",
             "/workspace/.mcp.json", "--server", "srv", "--out", str(out)],
            env=env_of(storage), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and "EINVAL" in done.stderr, done
    assert not mark.exists()
    assert snapshot(storage) == before


@needs_fuse_as_root
@needs_fuse
def test_f1_r2_d1_the_agent_view_adds_nothing_and_writes_nowhere_forbidden(
    searchable_storage: Path, scratch: Path
) -> None:
    """F-1, T-5, R-2, D-1, A-3: through ``ctx mount --as ci`` the root shows its six entries
    only (no ``mcp/``), a tool the agent may not run is not listed, nothing can be made at
    the root, the manual bundle and the agent's own controls cannot be written — and looking
    around the view leaves the storage root as it was (no copy made by authorization)."""
    storage = searchable_storage
    make_agent(storage, "ci", ["shell.exec"])
    grant_tool_side(storage, "ci_t", "shell.exec")
    before = snapshot(storage)
    (scratch / "view").mkdir()
    with serving(storage, scratch / "view", "--as", "ci") as mount:
        view = mount.where
        assert set(os.listdir(view)) == ROOT_ENTRIES
        assert not (view / "mcp").exists()
        assert "shell.exec" in os.listdir(view / "tool")
        assert "fs.write" not in os.listdir(view / "tool")
        for attempt in (
            lambda: (view / "audit").mkdir(),
            lambda: (view / "registry").write_text("x"),
            lambda: (view / "shared" / "cortexfs-docs" / "new.md").write_text("x"),
            lambda: (view / "agent" / "ci.d" / "policy").open("a").close(),
        ):
            with pytest.raises(PermissionError):
                attempt()
        for path in view.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_size < 65536:
                path.read_bytes()
    assert snapshot(storage) == before
