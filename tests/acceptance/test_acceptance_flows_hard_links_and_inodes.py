"""Hard links and inode identity across the storage root (SPEC §1 R-5, §2 Q-1..Q-8 and N-1,
§4 S-1/S-5, §6 T-1, §9 X-1; docs/queue.md "A queue shared by a group", docs/multi-host.md).

A file of a queue, a tool or a session may be a second name of a file that lives elsewhere:
a request a member hard-linked into ``pending/`` from their own notes, a result name or a
staging name taken by a link, a lease replaced by a link, a core tool or a control of the
system tier linked to a file outside it, a session's ``events.jsonl`` linked to someone's
file.  Whatever the product does to such a name (move, read, renew, remove, repair,
replace) must leave the other name's file as it was: same bytes, same mode, same owner.
The same storage root reached by two paths (a bind mount) is one queue, and a queue
directory moved to another filesystem is refused without losing the job.  Members of a
shared space work the queue as real unprivileged uids, with the ``link`` move strategy that
N-1 names as well as with ``rename``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    age,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    scratch_top,
    snapshot,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, members_of

SCRATCH = scratch_top(__file__)
PROJECT = "proj"
SPACE = "hlspace"
GROUP, MEMBER_A, MEMBER_B = "ctxhl-g", "ctxhl-a", "ctxhl-b"

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids, mounts)")


# --------------------------------------------------------------------------- helpers


def identity(path: Path) -> tuple:
    """What another name of a file must keep: its bytes, mode, owner and group (never
    following a link)."""
    st = path.lstat()
    return (path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)


def same_file(a: Path, b: Path) -> bool:
    sa, sb = a.lstat(), b.lstat()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def no_traceback(run: Run | subprocess.CompletedProcess) -> None:
    err = run.err if isinstance(run, Run) else run.stderr
    assert "Traceback" not in err, run


@dataclass
class Root:
    """A bootstrapped storage root with the queue of :data:`PROJECT`, in a scratch directory
    every uid may search."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def q(self) -> Path:
        return self.storage / "shared" / PROJECT / "queue"

    def ctx(self, *args: str | os.PathLike, stdin: str = "") -> Run:
        return ctx_run(*args, input=stdin, env=clean_env(CTX_STORAGE=str(self.storage)))

    def queue(self, verb: str, *args: str | os.PathLike, stdin: str = "") -> Run:
        return self.ctx("queue", verb, "--project", PROJECT, *args, stdin=stdin)

    def publish(self, name: str) -> str:
        done = self.queue("publish", "--name", name, "-", stdin=json.dumps(request(tag=name)))
        assert done.rc == 0, done
        return done.out.strip()

    def claim(self) -> str:
        done = self.queue("claim")
        assert done.rc == 0, done
        return done.out.strip()

    def finish(self, job: str) -> Run:
        return self.queue("finish", job, "--ok", "-", stdin=json.dumps({"ran": job}))

    def settled(self) -> None:
        """Nothing in flight; plain and reconciling recover call the queue consistent."""
        for sub in ("pending", "claimed", "lease", "inbox"):
            assert os.listdir(self.q / sub) == [], sub
        for args in ((), ("--reconcile",)):
            done = self.queue("recover", "--json", *args)
            assert done.rc == 0 and done.json()["consistent"] is True, done


@pytest.fixture(scope="module")
def _template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hl-template") / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    made = ctx_run("queue", "init", "--project", PROJECT, env=clean_env(CTX_STORAGE=str(root)))
    assert made.rc == 0, made
    return root


@pytest.fixture
def root(_template: Path) -> Iterator[Root]:
    top = new_scratch_dir(SCRATCH, "root-")
    copy_of_root(_template, top / "storage")
    yield Root(top)
    subprocess.run(["rm", "-rf", str(top)], check=False)


def outside_file(top: Path, name: str, text: str, mode: int) -> Path:
    """A file of somebody's own, outside the storage root."""
    path = top / name
    path.write_text(text)
    path.chmod(mode)
    return path


# --------------------------------------------------------------------------- queue, as root


def test_a_request_linked_in_from_outside_runs_once_and_the_outside_file_keeps_everything(root):
    """Q-2, Q-4, Q-8: ``pending/J`` is a second name of a file outside the queue (st_nlink 2,
    mode 0640).  claim moves it, finish moves it again: neither reads it through anything
    but the queue's name, nor chmods, chowns or rewrites it; the outside name still shows the
    request's bytes and mode, and it is the very file that now stands as ``done/J``."""
    text = json.dumps(request(tag="linked"))
    outside = outside_file(root.top, "notes.json", text, 0o640)
    before = identity(outside)
    job = "linked.req.json"
    os.link(outside, root.q / "pending" / job)

    claimed = root.queue("claim", "--json")
    assert claimed.rc == 0, claimed
    assert claimed.json()["name"] == job
    assert claimed.json()["request"]["tag"] == "linked"
    assert identity(outside) == before
    assert same_file(outside, root.q / "claimed" / job / job)
    finished = root.finish(job)
    assert finished.rc == 0, finished

    assert identity(outside) == before
    assert outside.stat().st_nlink == 2 and same_file(outside, root.q / "done" / job)
    assert json.loads((root.q / "done" / f"{job}.result").read_text())["status"] == "ok"
    root.settled()


def test_one_file_under_two_job_names_is_two_jobs_each_run_once(root):
    """Q-1, Q-2, I-1, I-3: the same inode is ``pending/A`` and ``pending/B``.  Each name is a
    job of its own: both are claimed once, finished once, and end in ``done/`` as the same
    file, which no step changed."""
    first = root.publish("twin-a")
    second = "twin-b.req.json"
    os.link(root.q / "pending" / first, root.q / "pending" / second)
    before = identity(root.q / "pending" / first)

    taken = sorted(root.claim() for _ in range(2))
    assert taken == sorted([first, second])
    assert root.queue("claim").rc == 3
    for job in taken:
        assert root.finish(job).rc == 0
    for job in taken:
        assert identity(root.q / "done" / job) == before
        assert root.queue("finish", job, "--ok", "-", stdin="{}").rc == 1  # never twice
    assert same_file(root.q / "done" / first, root.q / "done" / second)
    root.settled()


def test_a_result_name_taken_by_a_link_to_an_outside_file_is_never_written_through(root):
    """Q-4, Q-6: ``done/J.result`` already exists, a hard link of someone's file.  finish
    moves its result there *without replacing*: it is refused (exit 1, EEXIST), J stays
    claimed, no temp file stays behind, and the outside file keeps its bytes and mode."""
    job = root.publish("result-taken")
    assert root.claim() == job
    outside = outside_file(root.top, "theirs.json", '{"status": "ok", "output": 1}\n', 0o600)
    before = identity(outside)
    os.link(outside, root.q / "done" / f"{job}.result")

    refused = root.finish(job)

    assert refused.rc == 1 and "EEXIST" in refused.err, refused
    no_traceback(refused)
    assert identity(outside) == before and outside.stat().st_nlink == 2
    assert (root.q / "claimed" / job / job).is_file() and (root.q / "lease" / job).is_dir()
    assert os.listdir(root.q / "inbox") == []


def test_stale_staging_names_linked_to_outside_files_lose_only_their_name(root):
    """Q-6: a file at a staging name of ``inbox/`` that is a second name of a file outside
    the queue, older than the grace period, is a stray temp file: ``recover --reconcile``
    removes that name only; the outside file keeps its bytes, mode and owner."""
    job = "staged.req.json"
    outside = outside_file(root.top, "diary.txt", "not a request\n", 0o644)
    before = identity(outside)
    temp = root.q / "inbox" / f"{job}.publish.0123456789ab.tmp"
    os.link(outside, temp)
    age(temp, 3600)

    plain = root.queue("recover", "--json")
    assert plain.rc == 0 and temp.exists(), plain
    reconciled = root.queue("recover", "--reconcile", "--json")

    assert reconciled.rc == 0, reconciled
    assert reconciled.json()["removed_temps"] == [f"inbox/{temp.name}"]
    assert not temp.exists()
    assert identity(outside) == before and outside.stat().st_nlink == 1


def test_a_lease_replaced_by_a_link_is_renewed_and_removed_by_name_only(root):
    """Q-3, Q-4: ``lease/J/worker`` is swapped for a hard link of a file outside the queue
    that holds the same lease.  renew writes a new lease beside it and renames it into place;
    finish removes the name: the outside file is never written, truncated or chmodded."""
    job = root.publish("leased")
    assert root.claim() == job
    lease = root.q / "lease" / job / "worker"
    outside = outside_file(root.top, "lease-copy.json", lease.read_text(), 0o644)
    before = identity(outside)
    lease.unlink()
    os.link(outside, lease)

    renewed = root.queue("renew", job, "--ttl", "900")
    assert renewed.rc == 0, renewed
    assert identity(outside) == before
    assert not same_file(outside, lease)
    assert json.loads(lease.read_text())["expires_at"] != json.loads(before[0])["expires_at"]
    assert root.finish(job).rc == 0

    assert identity(outside) == before and outside.stat().st_nlink == 1
    root.settled()


def test_recover_requeues_a_linked_request_and_drops_only_a_crash_copy(root):
    """Q-5, Q-6: a claim without a lease whose request is also linked from outside goes back
    to pending as the same file; a second name of ``pending/J`` left in ``claimed/J/J`` (what
    an interrupted link-strategy move leaves) is dropped, never the pending one; the outside
    file is untouched throughout and a second run changes nothing (I-5)."""
    text = json.dumps(request(tag="requeue"))
    outside = outside_file(root.top, "keep.json", text, 0o600)
    before = identity(outside)
    job, copy = "requeue.req.json", "copy.req.json"
    (root.q / "claimed" / job).mkdir()
    os.link(outside, root.q / "claimed" / job / job)
    os.link(outside, root.q / "pending" / copy)
    (root.q / "claimed" / copy).mkdir()
    os.link(outside, root.q / "claimed" / copy / copy)

    report = root.queue("recover", "--reconcile", "--json")

    assert report.rc == 0, report
    assert sorted(f["job"] for f in report.json()["repaired"]) == [copy, job]
    for name in (job, copy):
        assert same_file(outside, root.q / "pending" / name)
    assert os.listdir(root.q / "claimed") == [] and os.listdir(root.q / "lease") == []
    assert identity(outside) == before and outside.stat().st_nlink == 3
    again = snapshot(root.q)
    assert root.queue("recover", "--reconcile").rc == 0
    assert snapshot(root.q) == again


# --------------------------------------------------------------------------- tiers, sessions


def test_bootstrap_replaces_a_core_tool_linked_outside_and_never_chmods_a_linked_control(root):
    """R-5, T-1: ``tool/fs.read`` is a hard link of a text file outside the tier (mode 0600),
    and ``tool/fs.stat.d/policy`` a hard link of a world-writable file.  Bootstrap puts a new
    executable at the tool's name, leaving the outside file as it was; the control it does
    not vouch for is named as a problem and left alone, never chmodded through its other
    name."""
    tool, policy = root.storage / "tool" / "fs.read", root.storage / "tool/fs.stat.d/policy"
    notes = outside_file(root.top, "notes.txt", "important text\n", 0o600)
    shared = outside_file(root.top, "policy.txt", "allow x_t tool:fs.stat execute\n", 0o666)
    os.chmod(shared, 0o666)  # whatever the umask
    kept = identity(notes), identity(shared)
    for path, other in ((tool, notes), (policy, shared)):
        path.unlink()
        os.link(other, path)

    done = root.ctx("bootstrap", "--storage", root.storage)

    no_traceback(done)
    assert done.rc == 1 and "tool/fs.stat.d/policy" in done.out + done.err, done
    assert (identity(notes), identity(shared)) == kept
    assert not same_file(tool, notes) and tool.stat().st_mode & 0o111
    assert same_file(policy, shared)


def test_a_shared_sessions_events_file_linked_to_another_file_is_never_cut(root):
    """S-5: ``ctx session repair --project P`` of a shared session whose ``events.jsonl`` is
    a hard link of a file elsewhere, ending without a newline: refused (EINVAL, naming the
    two names), and the other file keeps its last line."""
    session = root.storage / "shared" / PROJECT / "agent" / "coder" / "session" / "default"
    session.mkdir(parents=True)
    text = '{"type": "note"}\nthe last line, with no newline'
    notes = outside_file(root.top, "log.txt", text, 0o644)
    os.link(notes, session / "events.jsonl")

    done = root.ctx("session", "repair", "coder", "--project", PROJECT)

    no_traceback(done)
    assert done.rc != 0 and "EINVAL" in done.err and "2 names" in done.err, done
    assert notes.read_text() == text


@as_root
def test_bootstrap_leaves_a_home_events_file_linked_to_roots_file_as_it_was(root):
    """S-1, R-5: a home session an older version made 0750, whose ``events.jsonl`` its user
    replaced by a hard link of a root-owned file that user's group may write (what
    fs.protected_hardlinks lets them link).  Bootstrap tightens the user's own directory and
    names the linked file instead of chmodding it: root's file keeps mode 0660."""
    (user,), _ = members_of(GROUP, MEMBER_A)
    home = root.storage / "home" / str(user.uid)
    session = home / "agent" / "coder" / "session" / "default"
    session.mkdir(parents=True)
    for path in (home, home / "agent", home / "agent/coder", session.parent, session):
        os.chown(path, user.uid, user.gid)
        path.chmod(0o750)
    roots = outside_file(root.top, "roots.log", "root's line\n", 0o660)
    os.chown(roots, 0, user.gid)
    roots.chmod(0o660)
    before = identity(roots)
    os.link(roots, session / "events.jsonl")

    done = root.ctx("bootstrap", "--storage", root.storage)

    no_traceback(done)
    assert identity(roots) == before
    assert "events.jsonl" in done.out + done.err, done
    assert stat.S_IMODE(session.stat().st_mode) == 0o700


# --------------------------------------------------------------------------- one queue, two names


@as_root
def test_one_storage_root_under_two_paths_is_one_queue(root):
    """Q-1, Q-2, Q-9, N-1: the storage root bind-mounted at a second path.  Jobs published
    through either path are claimed through the other, each exactly once, whatever claim
    order each path keeps, and the queue settles."""
    mounts = ScratchMounts(new_scratch_dir(SCRATCH, "bind-"))
    try:
        second = mounts.bind(root.storage, "second")

        def queue_at(storage: Path, verb: str, *args: str, stdin: str = "") -> Run:
            return ctx_run("queue", verb, "--project", PROJECT, *args, input=stdin,
                           env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip

        published = []
        for n in range(4):
            storage = root.storage if n % 2 == 0 else second
            req = json.dumps(request(tag=str(n)))
            done = queue_at(storage, "publish", "--name", f"via-{n}", "-", stdin=req)
            assert done.rc == 0, done
            published.append(done.out.strip())
        claimed = []
        for n in range(4):
            storage = second if n % 2 == 0 else root.storage
            done = queue_at(storage, "claim")
            assert done.rc == 0, done
            claimed.append(done.out.strip())
            assert queue_at(storage, "finish", claimed[-1], "--ok", "-", stdin="{}").rc == 0
        assert queue_at(second, "claim").rc == 3 and queue_at(root.storage, "claim").rc == 3
        assert sorted(claimed) == sorted(published)
    finally:
        mounts.close()
    root.settled()


@as_root
def test_a_queue_directory_moved_to_another_filesystem_is_refused_and_the_job_is_kept(root):
    """Q-2, Q-4, Q-7: ``claimed/`` and then ``done/`` become mount points of another
    filesystem (a tmpfs bound over them) between commands.  A rename never crosses
    filesystems: the claim is refused (exit 1, EXDEV) with J still pending; once claimed,
    the finish is refused with J still claimed and no result written; back on one
    filesystem, the job finishes and the queue settles."""
    mounts = ScratchMounts(new_scratch_dir(SCRATCH, "xdev-"))
    try:
        elsewhere = mounts.tmpfs("elsewhere", "mode=2770,size=1m")
        job = root.publish("crossing")
        covered = mounts.bind(elsewhere, root.q / "claimed")
        refused = root.queue("claim")
        assert refused.rc == 1 and "EXDEV" in refused.err, refused
        no_traceback(refused)
        mounts.unmount(covered)
        assert os.listdir(root.q / "pending") == [job] and os.listdir(root.q / "claimed") == []

        assert root.claim() == job
        covered = mounts.bind(elsewhere, root.q / "done")
        refused = root.finish(job)
        assert refused.rc == 1 and "EXDEV" in refused.err, refused
        no_traceback(refused)
        mounts.unmount(covered)
        assert os.listdir(root.q / "done") == [] and os.listdir(root.q / "inbox") == []
        assert (root.q / "claimed" / job / job).is_file()
        assert root.finish(job).rc == 0
    finally:
        mounts.close()
    root.settled()


# --------------------------------------------------------------------------- members of a space


@dataclass
class Space:
    top: Path
    a: UnprivilegedUser
    b: UnprivilegedUser

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def q(self) -> Path:
        return self.storage / "shared" / SPACE / "queue"

    def run(self, who: UnprivilegedUser | None, argv: list[str], stdin: str = ""):
        env = {k: v for k, v in clean_env(CTX_STORAGE=str(self.storage)).items()
               if not k.startswith("XDG_")}  # fmt: skip
        name = who.name if who else "root"
        env.update(HOME="/nonexistent", XDG_CACHE_HOME=str(self.top / f"cache-{name}"))
        ids = {} if who is None else {"user": who.uid, "group": who.gid, "extra_groups": who.groups}
        return subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True,
                              timeout=60, umask=0o022, cwd="/", **ids)  # fmt: skip

    def queue(self, who: UnprivilegedUser | None, verb: str, *args: str, stdin: str = ""):
        return self.run(who, [*CTX_ARGV, "queue", verb, "--project", SPACE, *args], stdin)

    def hand_made(self, who: UnprivilegedUser, name: str, mode: int) -> str:
        """A request ``who`` writes into ``pending/`` by hand, mode ``mode`` (group-readable:
        any member may read it), as docs/queue.md allows; its job name."""
        job = f"{name}.req.json"
        text = json.dumps(request(tag=name))
        script = f'umask {0o777 & ~mode:03o}; printf "%s" "$1" > "$2"'
        done = self.run(who, ["/bin/sh", "-ec", script, "sh", text, str(self.q / "pending" / job)])
        assert done.returncode == 0, done
        return job

    def move(self, strategy: str) -> None:
        config = self.q / "config"
        lines = [ln for ln in config.read_text().splitlines() if not ln.startswith("move=")]
        config.write_text("\n".join([*lines, f"move={strategy}"]) + "\n")


@pytest.fixture
def space() -> Iterator[Space]:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as the members of a space")
    (a, b), _ = members_of(GROUP, MEMBER_A, MEMBER_B)
    top = new_scratch_dir(SCRATCH, "space-")
    w = Space(top, a, b)
    for argv in (["bootstrap"], ["shared", "create", SPACE, "--group", GROUP]):
        made = w.run(None, [*CTX_ARGV, *argv])
        assert made.returncode == 0, made
    yield w
    subprocess.run(["rm", "-rf", str(top)], check=False)


def claim_and_finish_all(w: Space, who: UnprivilegedUser, holder: int) -> list[str]:
    """Every job ``who`` can claim, each finished at once; the names in claim order."""
    taken = []
    for _ in range(5):
        claimed = w.queue(who, "claim", "--pid", str(holder))
        no_traceback(claimed)
        if claimed.returncode == 3:
            return taken
        assert claimed.returncode == 0, claimed
        job = claimed.stdout.strip()
        done = w.queue(who, "finish", job, "--ok", "-", stdin="{}")
        assert done.returncode == 0, done
        taken.append(job)
    return taken


def test_a_member_claims_another_members_group_readable_request_with_renames(space):
    """Q-2, X-1: member A wrote a request into ``pending/`` by hand, mode 0640: the group may
    read it, not write it.  With the rename strategy member B claims it (a rename needs no
    right on the file), runs it, and the next job after it too; A's file is moved as it is."""
    w = space
    w.move("rename")
    job = w.hand_made(w.a, "by-hand", 0o640)
    time.sleep(0.01)  # published after it: second in the claim order
    nxt = w.queue(w.a, "publish", "--name", "after", "-", stdin=json.dumps(request()))
    assert nxt.returncode == 0, nxt
    with subprocess.Popen(["sleep", "60"], user=w.b.uid, group=w.b.gid) as holder:
        try:
            taken = claim_and_finish_all(w, w.b, holder.pid)
        finally:
            holder.kill()
    assert sorted(taken) == sorted([job, nxt.stdout.strip()])
    st = (w.q / "done" / job).stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (w.a.uid, 0o640)


def test_a_member_claims_another_members_group_readable_request_with_links(space):
    """Q-2, N-1, X-1: the same queue with ``move=link`` (what N-1's shared filesystems use,
    and what docs/multi-host.md says to set to force it).  The protocol relies on link(2) in
    place of the no-replace rename, so what a rename claims a link claims too: member B takes
    A's hand-made 0640 request and the job after it, and A's file ends in ``done/`` as it
    was.  The kernel lets an unprivileged uid link only a file it owns or may read *and*
    write (fs.protected_hardlinks), so such a request is at least passed over, never a
    refusal of the whole claim that keeps every later job from B."""
    w = space
    w.move("link")
    job = w.hand_made(w.a, "by-hand", 0o640)
    time.sleep(0.01)
    nxt = w.queue(w.a, "publish", "--name", "after", "-", stdin=json.dumps(request()))
    assert nxt.returncode == 0, nxt
    with subprocess.Popen(["sleep", "60"], user=w.b.uid, group=w.b.gid) as holder:
        try:
            taken = claim_and_finish_all(w, w.b, holder.pid)
            assert nxt.stdout.strip() in taken
            assert job in taken or (w.q / "pending" / job).is_file()
            if job not in taken:  # passed over: the next claim says why; its owner claims it
                again = w.queue(w.b, "claim", "--pid", str(holder.pid))
                assert again.returncode == 3 and again.stdout == "", again
                assert "fs.protected_hardlinks" in again.stderr and job in again.stderr, again
                mine = w.queue(w.a, "claim", "--pid", str(holder.pid))
                assert (mine.returncode, mine.stdout.strip()) == (0, job), mine
        finally:
            holder.kill()


def test_a_member_linking_their_own_file_into_pending_changes_nothing_of_it(space):
    """Q-8, X-1: member A hard-links a file of their own from outside the queue into
    ``pending/`` twice (allowed by fs.protected_hardlinks: A owns it).  Member B claims and
    finishes both; root recovers the queue: A's outside file keeps its bytes, mode 0644 and
    owner, and no step gives it the queue's group or rewrites it."""
    w = space
    own = w.top / "a-own"
    own.mkdir(mode=0o755)
    os.chown(own, w.a.uid, w.a.gid)
    outside = own / "notes.json"
    made = w.run(w.a, ["/bin/sh", "-ec", 'umask 022; printf "%s" "$1" > "$2"', "sh",
                       json.dumps(request(tag="notes")), str(outside)])  # fmt: skip
    assert made.returncode == 0, made
    before = identity(outside)
    w.move("rename")  # the link strategy: see the test above
    for n in range(2):
        job = f"notes-{n}.req.json"
        linked = w.run(w.a, ["ln", str(outside), str(w.q / "pending" / job)])
        assert linked.returncode == 0, linked
        with subprocess.Popen(["sleep", "60"], user=w.b.uid, group=w.b.gid) as holder:
            try:
                assert claim_and_finish_all(w, w.b, holder.pid) == [job]
            finally:
                holder.kill()
        assert identity(outside) == before
        assert same_file(outside, w.q / "done" / job)
    recovered = w.queue(None, "recover", "--reconcile", "--json")
    assert recovered.returncode == 0, recovered
    assert identity(outside) == before and outside.stat().st_nlink == 3
