"""One storage root, two ways to look at it: the ``ctx`` command and a ``/ctx``-style FUSE mount
of the same root (SPEC §13 F-1, docs/mount.md).  Every fact readable both ways must be the
same fact:

* the queue (§2.1, §2.4): what ``ls`` of ``pending/``, ``claimed/``, ``lease/``, ``done/`` and
  ``failed/`` shows through the mount against ``ctx queue status --json`` and
  ``ctx queue list --json``; each job's evidence (``ctx queue show --json``: path, kind, size,
  mtime, inode, request, lease, result) against ``stat`` and ``cat`` through the mount;
* sessions (S-1, S-2, S-5, S-6): ``events.jsonl`` read through the host's view and through the
  agent's view against ``ctx session show --json`` and ``ctx session list --json``;
* tools (T-1, T-4, T-8a): ``ls``/``cat`` of ``tool/`` and ``tool/X.d/`` through the mount
  against ``ctx object list --json`` and ``ctx object which --json``;
* the agent's view (T-5, P-5, P-6): what an agent's uid lists through ``ctx mount --as``
  against ``ctx agent show --json`` (its ``tool_mounts``) and ``ctx policy explain``;
* metadata: mode, owner, size, mtime, inode and link count through either view against the
  storage root itself;

and this after changes made by ``ctx`` while the mount is up (seen through the mount once the
caching period docs/mount.md names has passed, never a stale or a missing entry after it) and
after changes made through the mount (seen by ``ctx`` at once), including ``ctx`` itself run
through the mount, as root on the host's view and as the agent's uid on the agent's view."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Mount,
    OnStorage,
    Run,
    clean_env,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    request,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

SCRATCH = scratch_top(__file__)
AGENT, LABEL = "dev", "dev_t"
SPACE = "team"
PROJECT = "proj"
STATES = ("pending", "claimed", "done", "failed")
# docs/mount.md: the mount keeps an answer half a second, the kernel half a second more.
# Conditions that must hold once that period has passed are waited for with this much room.
SETTLE = 8.0

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving the agent's uid needs root


# ------------------------------------------------------------------------------ helpers


@dataclass
class World(OnStorage):
    """A storage root (searchable by every uid) with queue ``proj``, space ``team`` of the
    test user's group, agent ``dev`` running as the test user with ``shared:team read write``,
    ``fs.stat`` allowed by both policies (``fs.list`` by the agent's only), two shared
    sessions ``s1`` (``session:s1 read`` granted) and ``s2`` (not) and one home session;
    mounted twice: the host's view at ``host`` and ``dev``'s view at ``agent``."""

    storage: Path
    top: Path
    user: UnprivilegedUser
    host_mount: Mount
    agent_mount: Mount

    @property
    def host(self) -> Path:
        return self.host_mount.where

    @property
    def agent(self) -> Path:
        return self.agent_mount.where

    def queue_dir(self, view: Path, project: str = PROJECT) -> Path:
        return view / "shared" / project / "queue"

    def q(self, *args: str, project: str = PROJECT, **kw) -> Run:
        return self.ctx("queue", args[0], "--project", project, *args[1:], **kw)

    def publish(self, project: str = PROJECT, **extra) -> str:
        done = self.q("publish", "-", project=project, input=json.dumps(request(**extra)))
        assert done.rc == 0, done
        return done.out.strip()

    def publish_many(self, count: int) -> list[str]:
        """``count`` requests published with one ``ctx queue publish --batch``; their names."""
        lines = "".join(json.dumps(request(n=n)) + "\n" for n in range(count))
        done = self.q("publish", "--batch", "-", input=lines)
        assert done.rc == 0, done
        assert len(done.lines()) == count, done
        return done.lines()

    def claim(self, project: str = PROJECT) -> str:
        done = self.q("claim", "--ttl", "600", project=project)
        assert done.rc == 0, done
        return done.out.strip()

    def finish(self, job: str, flag: str, project: str = PROJECT) -> None:
        done = self.q("finish", job, flag, "-", project=project, input='{"answer": 42}')
        assert done.rc == 0, done

    def as_agent(self, *argv: str | os.PathLike, stdin: str | None = None):
        """``argv`` run as the agent's uid with its own group only (its identity), no
        CortexFS setting in the environment, from ``/``."""
        env = clean_env(HOME="/tmp", LC_ALL="C")
        return run_as(
            self.user, [str(a) for a in argv], [self.user.gid], env=env, cwd=Path("/"),
            stdin=stdin,
        )  # fmt: skip

    def ctx_as_agent(self, *args: str | os.PathLike, stdin: str | None = None):
        return self.as_agent(*CTX_ARGV, *args, stdin=stdin)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    storage.chmod(0o755)
    base = OnStorage()
    base.storage = storage
    try:
        done = base.ctx("shared", "create", SPACE, "--group", str(user.gid))
        assert done.rc == 0, done
        base.create_agent(
            {
                "name": AGENT,
                "label": LABEL,
                "tools": ["fs.stat", "fs.list"],
                "shared": {SPACE: ["read", "write"]},
            },
            "--user",
            user.name,
        )
        home = storage / "home" / str(user.uid)  # R-4, made by the host
        home.mkdir(mode=0o755)
        os.chown(home, user.uid, user.gid)
        base.allow_tool(LABEL, "fs.stat")
        for session, where in (("s1", "--project"), ("s2", "--project"), ("default", None)):
            extra = [where, SPACE] if where else []
            ran = base.ctx("run", "--agent", AGENT, "--session", session, *extra, "fs.stat", "/ctx")
            assert ran.rc == 0, ran
        with (storage / "agent" / f"{AGENT}.d" / "policy").open("a") as policy:
            policy.write(f"allow {LABEL} session:s1 read\n")
        (top / "host").mkdir()
        (top / "agent").mkdir()
        with (
            serving(storage, top / "host") as host_mount,
            serving(storage, top / "agent", "--as", AGENT) as agent_mount,
        ):
            yield World(storage, top, user, host_mount, agent_mount)
            for mount in (host_mount, agent_mount):
                assert "Traceback" not in mount.said(), mount.said()
    finally:
        shutil.rmtree(top, ignore_errors=True)


def listed(path: Path) -> set[str]:
    """The names ``path`` lists, dot-files (the host's own lock files) left out."""
    return {name for name in os.listdir(path) if not name.startswith(".")}


def microseconds(stamp: str) -> int:
    """An RFC 3339 time as ``ctx`` prints it, in microseconds since the epoch."""
    then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (then - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def jobs_seen_through(queue: Path) -> dict[str, str]:
    """Each job and its §2.1 state as ``ls`` of the state directories shows it: a claimed
    job needs ``claimed/J/J`` and ``lease/J/worker``, a finished one its result beside it."""
    seen: dict[str, str] = {}
    for name in listed(queue / "pending"):
        seen[name] = "pending"
    for name in listed(queue / "claimed"):
        if name in listed(queue / "claimed" / name) and "worker" in listed(queue / "lease" / name):
            seen[name] = "claimed"
    for state in ("done", "failed"):
        names = listed(queue / state)
        for name in names:
            if not name.endswith(".result") and f"{name}.result" in names:
                seen[name] = state
    return seen


def cli_jobs(world: World, project: str = PROJECT) -> dict[str, str]:
    done = world.q("list", "--json", project=project)
    assert done.rc == 0, done
    return {job["name"]: job["state"] for job in done.json()}


def a_mixed_queue(world: World) -> dict[str, str]:
    """Queue ``proj`` holding two pending jobs, one claimed, one done and one failed, all
    made with ``ctx`` on the storage root; each job and its state."""
    jobs = world.publish_many(5)
    claimed = [world.claim() for _ in range(3)]
    world.finish(claimed[1], "--ok")
    world.finish(claimed[2], "--error")
    states = {job: "pending" for job in jobs}
    states.update({claimed[0]: "claimed", claimed[1]: "done", claimed[2]: "failed"})
    return states


def errno_of(action) -> str:
    try:
        action()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


STAT_FIELDS = ("st_mode", "st_uid", "st_gid", "st_size", "st_mtime_ns", "st_ctime_ns", "st_ino")


def stat_differences(storage: Path, view: Path, relative: str) -> list[tuple]:
    on_disk, seen = os.lstat(storage / relative), os.lstat(view / relative)
    found = [
        (relative, field, getattr(on_disk, field), getattr(seen, field))
        for field in STAT_FIELDS
        if getattr(on_disk, field) != getattr(seen, field)
    ]
    return found


# ------------------------------------------------------------------- the queue (§2)


def test_queue_states_listed_through_the_mount_are_what_queue_status_and_list_report(world):
    states = a_mixed_queue(world)
    through_mount = jobs_seen_through(world.queue_dir(world.host))
    assert through_mount == states
    assert cli_jobs(world) == states

    status = world.q("status", "--json")
    assert status.rc == 0, status
    counts = status.json()
    for state in STATES:
        assert counts[state] == sum(1 for s in through_mount.values() if s == state), state
        assert counts["counts"][state] == counts[state]
    # The claimed job's lease is the only one, and nothing is half made.
    queue = world.queue_dir(world.host)
    assert (
        listed(queue / "lease")
        == listed(queue / "claimed")
        == {job for job, state in states.items() if state == "claimed"}
    )
    assert counts["incomplete"] == [] and counts["conflicts"] == []
    assert listed(queue / "inbox") == set() and counts["temps"] == []

    # Each --state listing is the directory listing of that state through the mount.
    for state in STATES:
        one = world.q("list", "--state", state)
        assert one.rc == 0, one
        assert set(one.lines()) == {j for j, s in through_mount.items() if s == state}, state


def test_queue_show_evidence_is_what_stat_and_cat_through_the_mount_find(world):
    states = a_mixed_queue(world)
    queue = world.queue_dir(world.host)
    kinds = {stat.S_IFREG: "regular file", stat.S_IFDIR: "directory"}
    for job, state in states.items():
        shown = world.q("show", job, "--json")
        assert shown.rc == 0, shown
        facts = shown.json()
        assert facts["name"] == job and facts["state"] == state, facts
        paths = set()
        for piece in facts["evidence"]:
            relative = piece["path"].rstrip("/")
            paths.add(relative)
            seen = os.lstat(queue / relative)
            assert kinds.get(stat.S_IFMT(seen.st_mode)) == piece["kind"], piece
            assert seen.st_size == piece["size"], piece
            assert seen.st_ino == piece["inode"], piece
            # ctx prints microseconds, rounded: one microsecond apart at most.
            assert abs(seen.st_mtime_ns / 1000 - microseconds(piece["mtime"])) <= 1, piece
        expected = {
            "pending": {f"pending/{job}"},
            "claimed": {f"claimed/{job}", f"claimed/{job}/{job}", f"lease/{job}",
                        f"lease/{job}/worker"},
            "done": {f"done/{job}", f"done/{job}.result"},
            "failed": {f"failed/{job}", f"failed/{job}.result"},
        }[state]  # fmt: skip
        assert paths == expected, (job, paths)

        request_path = queue / (f"claimed/{job}/{job}" if state == "claimed" else f"{state}/{job}")
        assert facts["request"] == json.loads(request_path.read_text()), job
        if state in ("done", "failed"):
            on_mount = json.loads((queue / state / f"{job}.result").read_text())
            assert facts["result"] == on_mount, job
            assert on_mount["status"] == ("ok" if state == "done" else "error")
        if state == "claimed":
            assert facts["lease"] == json.loads((queue / "lease" / job / "worker").read_text())
            assert facts["holder"]["state"] == "alive", facts["holder"]


def test_queue_moves_made_by_ctx_while_mounted_reach_the_mount_within_the_cache_period(world):
    queue = world.queue_dir(world.host)
    # Names looked up (and missed) through the mount first, so the kernel holds entries and
    # negative entries for them when ctx moves the jobs on the storage root.
    named = f"early-{os.getpid()}"
    job = f"{named}.req.json"
    for state in ("pending", "done", "claimed", "lease"):
        assert not (queue / state / job).exists()
    done = world.q("publish", "--name", named, "-", input=json.dumps(request()))
    assert done.rc == 0 and done.out.strip() == job, done
    others = world.publish_many(3)

    def agrees() -> bool:
        return jobs_seen_through(queue) == cli_jobs(world)

    assert wait_for(agrees, SETTLE), (jobs_seen_through(queue), cli_jobs(world))
    assert (queue / "pending" / job).is_file()

    claimed = [world.claim() for _ in range(4)]
    assert set(claimed) == {job, *others}
    assert wait_for(agrees, SETTLE), (jobs_seen_through(queue), cli_jobs(world))
    world.finish(claimed[0], "--ok")
    world.finish(claimed[1], "--error")
    # A claim whose holder is gone: recover puts it back.
    gone = subprocess.Popen(["true"])
    gone.wait()
    late = world.publish(tag="late")
    abandoned = world.q("claim", "--pid", str(gone.pid), "--ttl", "600")
    assert abandoned.rc == 0 and abandoned.out.strip() == late, abandoned
    assert wait_for(agrees, SETTLE), (jobs_seen_through(queue), cli_jobs(world))
    recovered = world.q("recover", "--json")
    assert recovered.rc == 0, recovered
    assert cli_jobs(world)[late] == "pending"
    assert wait_for(agrees, SETTLE), (jobs_seen_through(queue), cli_jobs(world))
    final = cli_jobs(world)
    assert final[claimed[0]] == "done" and final[claimed[1]] == "failed", final

    # Once settled, no old name is served: each job is found under its state's name only.
    for moved, state in final.items():
        for elsewhere in ("pending", "done", "failed"):
            if elsewhere != state:
                assert errno_of(lambda e=elsewhere, m=moved: os.lstat(queue / e / m)) == "ENOENT"
        if state != "claimed":
            assert errno_of(lambda m=moved: os.lstat(queue / "claimed" / m)) == "ENOENT"
            assert errno_of(lambda m=moved: os.lstat(queue / "lease" / m)) == "ENOENT"
    status = world.q("status", "--json").json()
    assert status["incomplete"] == [] and status["conflicts"] == []


def test_queue_worked_through_the_host_view_by_ctx_is_what_ctx_reports_on_the_root(world):
    """The queue used all through the mount (as docs/mount.md asks, locks being the mount's):
    ``ctx --storage MOUNT`` publishes, claims and finishes; ``ctx`` on the storage root
    reports every step at once, with no caching in between."""
    through = clean_env(CTX_STORAGE=str(world.host))
    queue_on_root = world.queue_dir(world.storage)

    def via_mount(*args: str, input: str | None = None) -> Run:
        return world.ctx("queue", args[0], "--project", PROJECT, *args[1:], env=through,
                         input=input)  # fmt: skip

    made = via_mount("publish", "-", input=json.dumps(request(tag="via-mount")))
    assert made.rc == 0, made
    job = made.out.strip()
    assert cli_jobs(world) == {job: "pending"}
    assert json.loads((queue_on_root / "pending" / job).read_text())["tag"] == "via-mount"

    got = via_mount("claim", "--ttl", "600")
    assert got.rc == 0 and got.out.strip() == job, got
    assert cli_jobs(world) == {job: "claimed"}
    shown = world.q("show", job, "--json").json()
    assert shown["holder"]["state"] == "alive", shown
    assert shown["lease"] == json.loads((queue_on_root / "lease" / job / "worker").read_text())

    ended = via_mount("finish", job, "--ok", "-", input='{"made": "through the mount"}')
    assert ended.rc == 0, ended
    assert cli_jobs(world) == {job: "done"}
    assert world.q("show", job, "--json").json()["result"]["output"] == {
        "made": "through the mount"
    }
    assert world.q("status", "--json").json()["counts"]["done"] == 1
    # Files written through the mount are the caller's, as on the storage root.
    for name in (job, f"{job}.result"):
        assert (queue_on_root / "done" / name).stat().st_uid == 0


def test_the_agents_uid_works_its_space_queue_through_its_view_and_root_sees_each_step(world):
    """Non-root: the agent's uid runs ``ctx queue`` on ``--queue`` through ``ctx mount --as``
    (``shared:team write``); what root's ``ctx`` reports on the storage root, and what the
    view shows the agent, are the same jobs, owned by the agent's uid."""
    view_queue = world.queue_dir(world.agent, SPACE)
    root_queue = world.queue_dir(world.storage, SPACE)
    req = json.dumps(request(tag="from-the-agent"))

    made = world.ctx_as_agent("queue", "publish", "--queue", view_queue, "-", stdin=req)
    assert made.returncode == 0, made
    job = made.stdout.strip()
    assert cli_jobs(world, SPACE) == {job: "pending"}
    on_root = root_queue / "pending" / job
    assert on_root.stat().st_uid == world.user.uid
    assert json.loads(on_root.read_text())["tag"] == "from-the-agent"

    seen = world.ctx_as_agent("queue", "list", "--queue", view_queue, "--json")
    assert seen.returncode == 0, seen
    assert json.loads(seen.stdout) == world.q("list", "--json", project=SPACE).json()

    got = world.ctx_as_agent("queue", "claim", "--queue", view_queue, "--ttl", "600")
    assert got.returncode == 0 and got.stdout.strip() == job, got
    shown = world.q("show", job, "--json", project=SPACE).json()
    assert shown["state"] == "claimed", shown
    assert (root_queue / "lease" / job / "worker").stat().st_uid == world.user.uid

    ended = world.ctx_as_agent(
        "queue", "finish", "--queue", view_queue, job, "--error", "-", stdin='{"why": "test"}'
    )
    assert ended.returncode == 0, ended
    assert cli_jobs(world, SPACE) == {job: "failed"}
    mine = world.ctx_as_agent("queue", "status", "--queue", view_queue, "--json")
    theirs = world.q("status", "--json", project=SPACE)
    assert mine.returncode == 0 == theirs.rc, (mine, theirs)
    mine_counts, theirs_counts = json.loads(mine.stdout), theirs.json()
    for key in ("counts", "ignored", "incomplete", "conflicts", "temps", "owned_by_others",
                "group_not_inherited"):  # fmt: skip
        assert mine_counts[key] == theirs_counts[key], key


def test_ctx_pointed_at_the_mount_answers_as_pointed_at_the_storage_root(world):
    """The data commands read the same facts through the host's view as on the storage
    root: their outputs differ only by the root's path."""
    states = a_mixed_queue(world)
    commands = [
        ["queue", "status", "--project", PROJECT, "--json"],
        ["queue", "list", "--project", PROJECT, "--json"],
        *(
            ["queue", "show", "--project", PROJECT, job, "--json"]
            for job, state in states.items()
            if state in ("claimed", "done")
        ),
        ["session", "list", AGENT, "--project", SPACE, "--json"],
        ["session", "list", AGENT, "--json"],
        *(["session", "show", AGENT, s, "--project", SPACE, "--json"] for s in ("s1", "s2")),
        ["session", "show", AGENT],
        ["object", "list", "--json"],
        ["object", "which", "fs.stat", "--json"],
        ["agent", "list", "--json"],
    ]
    for command in commands:
        on_root = world.ctx(*command, "--storage", world.storage)
        on_mount = world.ctx(*command, "--storage", world.host)
        assert on_root.rc == 0, on_root
        assert on_mount.rc == on_root.rc, on_mount
        assert on_mount.out.replace(str(world.host), str(world.storage)) == on_root.out, command
    # The agent-facing commands judge an agent on the storage root itself: through the mount
    # they withhold its /ctx, saying that it is a mount of the root, not another root.
    shown = world.ctx("agent", "show", AGENT, "--json", "--storage", world.host)
    withheld = shown.json()["withheld_mounts"]
    assert shown.rc == 0 and withheld, shown
    said = json.dumps(withheld)
    assert "is a CortexFS mount ('ctx mount')" in said and "moved or copied" not in said, said


# ------------------------------------------------------------------ sessions (§4)


def session_dir(view: Path, session: str, uid: int | None = None) -> Path:
    if uid is not None:
        return view / "home" / str(uid) / "agent" / AGENT / "session" / session
    return view / "shared" / SPACE / "agent" / AGENT / "session" / session


def shown_events(world: World, session: str, *where: str) -> list[dict]:
    done = world.ctx("session", "show", AGENT, session, *where, "--json")
    assert done.rc == 0, done
    return [json.loads(line) for line in done.lines()]


def events_in(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_session_events_through_both_views_are_what_session_show_prints(world):
    uid = world.user.uid
    for session, where, dirs in (
        ("s1", ("--project", SPACE), lambda v: session_dir(v, "s1")),
        ("s2", ("--project", SPACE), lambda v: session_dir(v, "s2")),
        ("default", (), lambda v: session_dir(v, "default", uid)),
    ):
        events = shown_events(world, session, *where)
        assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
        assert events_in(dirs(world.host) / "events.jsonl") == events, session
        if session != "s2":  # s2 is not the agent's to read (S-6)
            read = world.as_agent("cat", dirs(world.agent) / "events.jsonl")
            assert read.returncode == 0, read
            assert events_in_text(read.stdout) == events, session

    # ctx session list against ls of the session directories, in each view.
    listing = world.ctx("session", "list", AGENT, "--project", SPACE, "--json")
    assert {s["name"] for s in listing.json()} == listed(session_dir(world.host, "s1").parent)
    assert {s["name"] for s in listing.json()} == {"s1", "s2"}
    in_agents_view = world.as_agent("ls", "-A", session_dir(world.agent, "s1").parent)
    assert in_agents_view.returncode == 0, in_agents_view
    readable = {
        s
        for s in ("s1", "s2")
        if world.ctx(
            "policy", "explain", AGENT, f"session:{s}", "read",
            "--location", f"shared/{SPACE}/agent/{AGENT}/session",
        ).rc == 0
    }  # fmt: skip
    assert set(in_agents_view.stdout.split()) == readable == {"s1"}

    # Another call recorded while both views are up: both show what session show prints.
    ran = world.ctx(
        "run", "--agent", AGENT, "--session", "s1", "--project", SPACE, "fs.stat", "/ctx"
    )
    assert ran.rc == 0, ran
    after = shown_events(world, "s1", "--project", SPACE)
    assert len(after) == 4
    for view in (world.host, world.agent):
        path = session_dir(view, "s1") / "events.jsonl"
        assert wait_for(lambda p=path: events_in(p) == after, SETTLE), (view, events_in(path))
        assert path.stat().st_size == len(path.read_bytes())


def events_in_text(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_an_event_appended_through_the_agents_view_is_refused_or_shown_as_explain_says(world):
    """Writing in its shared session through its view is the agent's when the chain says so
    (``session:s1 write`` and ``shared:team write``): refused while ``ctx policy explain``
    denies, and once granted, what the agent appended is what ``ctx session show`` prints."""
    events = session_dir(world.agent, "s1") / "events.jsonl"
    line = json.dumps(
        {"ts": "2026-06-22T12:00:00Z", "type": "note", "agent": AGENT, "session": "s1",
         "object": "session/s1", "status": "ok"}
    )  # fmt: skip
    append = 'printf "%s\\n" "$1" >> "$2"'
    location = ("--location", f"shared/{SPACE}/agent/{AGENT}/session")
    before = shown_events(world, "s1", "--project", SPACE)

    assert world.ctx("policy", "explain", AGENT, "session:s1", "write", *location).rc == 1
    refused = world.as_agent("sh", "-c", append, "sh", line, events)
    assert refused.returncode != 0 and "denied" in refused.stderr, refused
    assert shown_events(world, "s1", "--project", SPACE) == before

    with (world.storage / "agent" / f"{AGENT}.d" / "policy").open("a") as policy:
        policy.write(f"allow {LABEL} session:s1 write\n")
    assert world.ctx("policy", "explain", AGENT, "session:s1", "write", *location).rc == 0

    def appended() -> bool:
        return world.as_agent("sh", "-c", append, "sh", line, events).returncode == 0

    assert wait_for(appended, SETTLE)
    assert shown_events(world, "s1", "--project", SPACE) == [*before, json.loads(line)]
    assert events_in(session_dir(world.host, "s1") / "events.jsonl")[-1] == json.loads(line)


# ------------------------------------------------------------------------ tools (§6)


def test_tool_entries_and_controls_through_the_mount_agree_with_object_list_and_which(world):
    listing = world.ctx("object", "list", "--tier", "system", "--json")
    assert listing.rc == 0, listing
    tools = {t["name"]: t for t in listing.json()}
    tool_dir = world.host / "tool"
    on_mount = listed(tool_dir)
    executables = {
        n for n in on_mount if not n.endswith(".d") and stat.S_ISREG(os.lstat(tool_dir / n).st_mode)
    }
    assert set(tools) == executables, (set(tools), executables)
    assert {f"{n}.d" for n in tools} <= on_mount

    through_path = clean_env(CTX_STORAGE=str(world.storage), CTX_PATH=str(tool_dir))
    for name, facts in tools.items():
        controls = tool_dir / f"{name}.d"
        assert listed(controls) == listed(world.storage / "tool" / f"{name}.d"), name
        status = (controls / "status").read_text().strip()
        assert (facts["status"] == "available") == (status == "available"), (name, status)
        description = (controls / "description").read_text().strip()
        assert facts["description"].strip() == description, name
        # CTX_PATH naming the mount's tool/: which resolves there, controls beside it.
        which = world.ctx("object", "which", name, "--json", env=through_path)
        assert which.rc == 0, which
        assert which.json()["path"] == str(tool_dir / name)
        assert which.json()["controls"] == str(controls)

    # A control changed through the mount is what ctx reports at once ...
    (tool_dir / "fs.read.d" / "status").write_text("disabled\n")
    after = {t["name"]: t for t in world.ctx("object", "list", "--json").json()}
    assert after["fs.read"]["status"] == "disabled", after["fs.read"]
    # ... and an execute bit taken away through the mount takes the tool off CTX_PATH.
    os.chmod(tool_dir / "fs.list", 0o644)
    which = world.ctx("object", "which", "fs.list", "--json", env=through_path)
    assert which.rc == 1, which
    assert (world.storage / "tool" / "fs.list").stat().st_mode & 0o777 == 0o644


def tools_chain_allows(world: World) -> set[str]:
    """The system tools ``ctx object list`` calls available and ``ctx policy explain`` lets
    the agent execute."""
    tools = world.ctx("object", "list", "--tier", "system", "--json").json()
    return {
        t["name"]
        for t in tools
        if t["status"] == "available"
        and world.ctx("policy", "explain", AGENT, f"tool:{t['name']}", "execute").rc == 0
    }


def agent_tool_mounts(world: World) -> list[list]:
    shown = world.ctx("agent", "show", AGENT, "--json")
    assert shown.rc == 0, shown
    return shown.json()["tool_mounts"]


def agents_listing(world: World, target: str) -> set[str]:
    """What the agent's uid lists at ``target`` (a ``/ctx`` path) through its view."""
    where = world.agent / target.removeprefix("/ctx").lstrip("/")
    done = world.as_agent("ls", "-A", where)
    assert done.returncode == 0, done
    return set(done.stdout.split())


def test_the_agents_view_lists_what_agent_show_and_policy_explain_allow(world):
    allowed = tools_chain_allows(world)
    assert allowed == {"fs.stat"}
    expected_tools = {*allowed, *(f"{t}.d" for t in allowed), "tsh.d"}
    assert agents_listing(world, "/ctx/tool") == expected_tools

    # Every filtered mount agent show names lists, to the agent's uid, just those names.
    filtered = [m for m in agent_tool_mounts(world) if len(m) == 4]
    assert {m[1] for m in filtered} >= {"/ctx", "/ctx/tool", "/ctx/shared", "/ctx/agent"}
    for source, target, _mode, names in filtered:
        assert agents_listing(world, target) == set(names), target
        assert set(names) <= listed(Path(source)), target

    # The tool's own policy granted through the host's view: explain, agent show and the
    # agent's view all come to allow fs.list.
    with (world.host / "tool" / "fs.list.d" / "policy").open("a") as policy:
        policy.write(f"allow {LABEL} tool:fs.list execute\n")
    assert world.ctx("policy", "explain", AGENT, "tool:fs.list", "execute").rc == 0
    tool_names = next(m[3] for m in agent_tool_mounts(world) if m[1] == "/ctx/tool")
    assert set(tool_names) == expected_tools | {"fs.list", "fs.list.d"}
    assert wait_for(lambda: agents_listing(world, "/ctx/tool") == set(tool_names), SETTLE)

    # Taken away again on the storage root: gone from all three.
    policy = world.storage / "tool" / "fs.list.d" / "policy"
    policy.write_text(policy.read_text().replace(f"allow {LABEL} tool:fs.list execute\n", ""))
    assert world.ctx("policy", "explain", AGENT, "tool:fs.list", "execute").rc == 1
    assert wait_for(lambda: agents_listing(world, "/ctx/tool") == expected_tools, SETTLE)

    # The name itself, not only the listing, is refused once the caching period passed.
    def looked_up() -> str:
        return world.as_agent("ls", world.agent / "tool" / "fs.list").stderr

    assert wait_for(lambda: "No such file" in looked_up(), SETTLE), looked_up()


def test_agents_and_tools_made_by_ctx_while_mounted_show_in_the_host_view_only(world, tmp_path):
    other = {"name": "helper", "label": "helper_t", "tools": []}
    world.create_agent(other)
    manifest = tool_manifest(tmp_path / "m", "demo.hello", "#!/bin/sh\necho hello\n")
    installed = world.ctx("object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed

    def agents_on(view: Path) -> set[str]:
        return {n for n in listed(view / "agent") if not n.endswith(".d")}

    agents = {a["name"] for a in world.ctx("agent", "list", "--json").json()}
    assert agents == {AGENT, "helper"}
    assert wait_for(lambda: agents_on(world.host) == agents, SETTLE), listed(world.host / "agent")
    tools = {t["name"] for t in world.ctx("object", "list", "--tier", "system", "--json").json()}
    assert "demo.hello" in tools

    def tools_on_host() -> set[str]:
        return {n for n in listed(world.host / "tool") if not n.endswith(".d")}

    assert wait_for(lambda: tools_on_host() == tools, SETTLE), tools_on_host()
    hello = world.host / "tool" / "demo.hello.d"
    assert listed(hello) == listed(world.storage / "tool" / "demo.hello.d")

    # The agent's view: its own entry only, and no tool its chain does not allow.
    assert agents_listing(world, "/ctx/agent") == {AGENT, f"{AGENT}.d"}
    assert "demo.hello" not in agents_listing(world, "/ctx/tool")
    assert world.ctx("policy", "explain", AGENT, "tool:demo.hello", "execute").rc == 1


# ------------------------------------------------------------------------- metadata


def test_stat_through_both_views_is_the_stat_of_the_storage_root(world):
    a_mixed_queue(world)
    differences: list[tuple] = []
    count = 0
    for dirpath, dirnames, filenames in os.walk(world.storage):
        for name in dirnames + filenames:
            relative = os.path.relpath(os.path.join(dirpath, name), world.storage)
            count += 1
            differences += stat_differences(world.storage, world.host, relative)
            disk = os.lstat(world.storage / relative)
            assert os.lstat(world.host / relative).st_nlink == disk.st_nlink, relative
    assert count > 100
    assert differences == []

    # The agent's view: every entry it can see has the storage root's attributes, and a
    # directory's link count is 1 ("not counted", docs/mount.md).
    seen_by_agent = 0
    for dirpath, dirnames, filenames in os.walk(world.agent):
        for name in dirnames + filenames:
            relative = os.path.relpath(os.path.join(dirpath, name), world.agent)
            seen_by_agent += 1
            differences += stat_differences(world.storage, world.agent, relative)
            seen = os.lstat(world.agent / relative)
            if stat.S_ISDIR(seen.st_mode):
                assert seen.st_nlink == 1, relative
            else:
                assert seen.st_nlink == os.lstat(world.storage / relative).st_nlink, relative
    assert seen_by_agent > 10
    assert differences == []

    # What ctx writes while mounted: the new entries' attributes reach both views.
    job = world.publish(tag="late")
    relative = f"shared/{PROJECT}/queue/pending/{job}"
    assert wait_for(lambda: stat_differences(world.storage, world.host, relative) == [], SETTLE)
    ran = world.ctx(
        "run", "--agent", AGENT, "--session", "s1", "--project", SPACE, "fs.stat", "/ctx"
    )
    assert ran.rc == 0, ran
    events = f"shared/{SPACE}/agent/{AGENT}/session/s1/events.jsonl"
    for view in (world.host, world.agent):
        assert wait_for(lambda v=view: stat_differences(world.storage, v, events) == [], SETTLE)
