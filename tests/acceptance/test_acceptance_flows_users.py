"""End-to-end flows of several human users of one host sharing a project (SPEC §1 R-1/R-4, §2,
§4 S-1/S-6, §9 X-1, §14): root makes a space for a group, two members publish, claim, renew,
finish and recover its jobs by turns, an outsider is kept out, a member's agent records a
session the other member reads, and a user with no root at all works a storage root of their
own that nobody else reaches.  Every command runs as the real uid it stands for, with the
groups the group database gives it, through the installed ``ctx``."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    clean_env,
    snapshot,
)
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, process_of, system_group_with, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as several users")

MEMBERS = ("ctxflow-a", "ctxflow-b")
OUTSIDER = "ctxflow-o"
GROUP = "ctxflow-g"
SPACE = "proj"


# ------------------------------------------------------------------------------ the people


@dataclass(frozen=True)
class Person(UnprivilegedUser):
    """A real user of the host, with a home of its own for the test."""

    def home(self, top: Path) -> Path:
        """The user's home for this test: a directory of its own below ``top``."""
        home = top / f"home-{self.name}"
        if not home.exists():
            home.mkdir()
            os.chown(home, self.uid, self.gid)
            home.chmod(0o755)
        return home


@dataclass(frozen=True)
class People:
    a: Person
    b: Person
    outsider: Person
    gid: int


@pytest.fixture(scope="module")
def people() -> People:
    """Two members of ``GROUP`` and one user outside it (system users, kept for later runs)."""
    found = users_named(*MEMBERS, OUTSIDER)
    gid = system_group_with(GROUP, MEMBERS)
    a, b, outsider = (Person(u.name, u.uid, u.gid) for u in found)
    if gid in outsider.groups or not all(gid in m.groups for m in (a, b)):
        pytest.skip(f"group {GROUP} does not have exactly the members this file needs")
    return People(a, b, outsider, gid)


def user_env(person: Person, top: Path, **extra: str) -> dict[str, str]:
    """A login-like environment of ``person``: its own HOME below ``top``, nothing of CortexFS
    and no XDG directory unless ``extra`` sets one."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("XDG_")}
    env.update(HOME=str(person.home(top)), USER=person.name, LOGNAME=person.name)
    env.update(extra)
    return env


def as_user(
    person: Person,
    env: dict[str, str],
    *args: str | os.PathLike,
    stdin: str = "",
    via_shell: bool = False,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``ctx ARGS`` as ``person`` (its uid, gid and every group of the group database, as
    ``setpriv --init-groups`` gives them), umask 022.  ``via_shell``: from a shell that exits
    right after it (the lease holder of a shell ``claim``)."""
    argv = [*CTX_ARGV, *map(str, args)]
    if via_shell:
        argv = ["/bin/sh", "-c", '"$@"; true', "sh", *argv]
    return subprocess.run(
        argv,
        input=stdin,
        user=person.uid,
        group=person.gid,
        extra_groups=person.groups,
        umask=0o022,
        env=env,
        cwd=cwd or Path(env["HOME"]),
        capture_output=True,
        text=True,
        timeout=60,
    )


def root_ctx(
    storage: Path, *args: str | os.PathLike, stdin: str = ""
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=stdin,
        env=clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(storage.parent / "cache")),
        capture_output=True,
        text=True,
        timeout=60,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def owner(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid


def request(path: str) -> str:
    return json.dumps({"tool": "fs.stat", "input": {"path": path}})


# ------------------------------------------------------------------------------ the space


@dataclass(frozen=True)
class Space:
    storage: Path
    top: Path
    people: People

    @property
    def dir(self) -> Path:
        return self.storage / "shared" / SPACE

    @property
    def queue(self) -> Path:
        return self.dir / "queue"

    def env(self, person: Person) -> dict[str, str]:
        return user_env(person, self.top, CTX_STORAGE=str(self.storage))

    def ctx(self, person: Person, *args: str | os.PathLike, **kw) -> subprocess.CompletedProcess:
        return as_user(person, self.env(person), *args, **kw)

    def queue_cmd(self, person: Person, verb: str, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.ctx(person, "queue", verb, "-p", SPACE, *args, **kw)

    def entries(self, state: str) -> list[str]:
        return sorted(os.listdir(self.queue / state))


@pytest.fixture
def space(traversable_tmp: Path, people: People) -> Space:
    """Root bootstraps a system root every uid may reach and runs ``ctx shared create proj
    --group ctxflow-g``."""
    storage = traversable_tmp / "storage"
    made = root_ctx(storage, "bootstrap")
    assert made.returncode == 0, made
    created = root_ctx(storage, "shared", "create", SPACE, "--group", GROUP)
    assert created.returncode == 0, created
    return Space(storage, traversable_tmp, people)


def assert_refused_outsider(done: subprocess.CompletedProcess, space: Space) -> None:
    """EACCES, exit 1, naming the space the outsider may not enter and the group that may."""
    assert done.returncode == 1, done
    assert done.stderr.startswith("ctx: EACCES: "), done.stderr
    assert f"uid {space.people.outsider.uid} may not " in done.stderr, done.stderr
    assert str(space.dir) in done.stderr and f"group {space.people.gid}" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ the queue


def test_two_members_hand_jobs_to_each_other_and_the_outsider_changes_nothing(
    space: Space,
) -> None:
    """Q-1, Q-2, Q-3, Q-4, X-1, §2.4, N-1: member A publishes one job and a batch, member B
    claims from a process of its own, renews and finishes, A reads the result; every entry made
    is the group's, so the other member can go on; A cannot renew B's lease; the outsider is
    refused every command with EACCES and the queue is left byte for byte as it was."""
    a, b, outsider = space.people.a, space.people.b, space.people.outsider
    single = space.queue_cmd(a, "publish", "--name", "review", "-", stdin=request("/"))
    assert single.returncode == 0 and single.stdout == "review.req.json\n", single
    lines = request("/one") + "\n" + request("/two") + "\n"
    batch = space.queue_cmd(a, "publish", "--batch", "-", stdin=lines)
    assert batch.returncode == 0, batch
    batch_jobs = batch.stdout.split()
    assert len(batch_jobs) == 2 and all(j.endswith(".req.json") for j in batch_jobs), batch
    published = ["review.req.json", *batch_jobs]
    assert space.entries("pending") == sorted(published)
    for job in published:
        path = space.queue / "pending" / job
        assert owner(path) == (a.uid, space.people.gid), job
        assert mode(path) & 0o060 == 0o060, f"{job}: {mode(path):o}"
        assert json.loads(path.read_text())["from"] == a.name  # §2.1: publish fills in `from`

    # The outsider: every verb refused, nothing changed (X-1: Linux permissions decide).
    before = snapshot(space.queue)
    for verb, args, stdin in (
        ("publish", ["--name", "intruder", "-"], request("/etc")),
        ("publish", ["--batch", "-"], request("/etc") + "\n"),
        ("claim", [], ""),
        ("status", [], ""),
        ("list", [], ""),
        ("show", ["review"], ""),
        ("renew", ["review", "--pid", "1"], ""),
        ("finish", ["review", "--ok", "-"], "{}"),
        ("recover", ["--reconcile"], ""),
    ):
        refused = space.queue_cmd(outsider, verb, *args, stdin=stdin)
        assert_refused_outsider(refused, space)
        assert refused.stdout == "", (verb, refused.stdout)
        as_json = space.queue_cmd(outsider, verb, *args, "--json", stdin=stdin)
        assert as_json.returncode == 1, as_json
        assert json.loads(as_json.stdout)["error"] == "EACCES"
        assert json.loads(as_json.stdout)["errno"] == 13
    assert snapshot(space.queue) == before

    with process_of(b) as desk:
        claimed = space.queue_cmd(b, "claim", "--pid", str(desk.pid), "--ttl", "60",
                                  "--worker", "b-desk", "--json")  # fmt: skip
        assert claimed.returncode == 0, claimed
        job = json.loads(claimed.stdout)["name"]
        assert job == "review.req.json"  # the oldest pending job first
        assert json.loads(claimed.stdout)["request"]["input"] == {"path": "/"}
        for entry in (space.queue / "claimed" / job, space.queue / "lease" / job):
            assert owner(entry) == (b.uid, space.people.gid), entry
            assert mode(entry) & 0o2070 == 0o2070, f"{entry}: {mode(entry):o}"
        worker = space.queue / "lease" / job / "worker"
        assert mode(worker) & 0o060 == 0o060 and owner(worker)[1] == space.people.gid
        lease = json.loads(worker.read_text())
        assert (lease["worker"], lease["pid"]) == ("b-desk", desk.pid)
        assert lease["host"] == os.uname().nodename  # N-1: liveness beyond a pid
        assert lease["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()

        renewed = space.queue_cmd(b, "renew", job, "--pid", str(desk.pid), "--ttl", "600")
        assert renewed.returncode == 0, renewed
        longer = json.loads(worker.read_text())
        assert longer["expires_at"] > lease["expires_at"]
        taken = space.queue_cmd(a, "renew", job, "--ttl", "900")  # only the holder renews
        assert taken.returncode == 1, taken
        assert taken.stderr.startswith("ctx: EACCES: "), taken.stderr
        assert "only the holder renews its lease" in taken.stderr, taken.stderr
        assert json.loads(worker.read_text()) == longer

        # A looks at the queue while B works: B's live claim is left alone.
        looked = space.queue_cmd(a, "recover", "--json")
        assert looked.returncode == 0, looked
        report = json.loads(looked.stdout)
        assert report["requeued"] == [] and [u["job"] for u in report["untouched"]] == [job]

        finished = space.queue_cmd(b, "finish", job, "--ok", "-", stdin='{"files": 7}')
        assert finished.returncode == 0 and finished.stdout.strip() == job, finished

    shown = space.queue_cmd(a, "show", job, "--json")
    assert shown.returncode == 0, shown
    seen = json.loads(shown.stdout)
    assert seen["state"] == "done"
    assert seen["result"]["status"] == "ok" and seen["result"]["output"] == {"files": 7}
    assert seen["result"]["worker"]["id"] == "b-desk"
    assert seen["request"]["from"] == a.name
    result = space.queue / "done" / f"{job}.result"
    assert owner(result) == (b.uid, space.people.gid) and mode(result) & 0o040
    status = space.queue_cmd(b, "status", "--json")
    assert status.returncode == 0, status
    counts = json.loads(status.stdout)
    assert (counts["pending"], counts["claimed"], counts["done"]) == (2, 0, 1)
    assert counts["owned_by_others"] == [] and counts["temps"] == []
    for state in ("inbox", "claimed", "lease"):
        assert space.entries(state) == [], state


def test_claims_a_member_left_behind_are_recovered_by_the_other_member_and_by_root(
    space: Space,
) -> None:
    """Q-5, Q-4, I-1, X-1: B claims from shells that exit at once; A's ``recover`` and then
    root's put each job back, group-usable, so B claims it again and A finishes B's claim with
    an error; every job ends in exactly one state and nothing is left in claimed/ or lease/."""
    a, b = space.people.a, space.people.b
    jobs = []
    for name in ("first", "second"):
        published = space.queue_cmd(a, "publish", "--name", name, "-", stdin=request(f"/{name}"))
        assert published.returncode == 0, published
        jobs.append(published.stdout.strip())
    first, second = jobs

    left = space.queue_cmd(b, "claim", via_shell=True)
    assert left.returncode == 0 and left.stdout.strip() == first, left
    by_member = space.queue_cmd(a, "recover")
    assert by_member.returncode == 0, by_member
    assert f"requeue  {first}: lease holder gone" in by_member.stdout, by_member.stdout
    assert space.entries("pending") == sorted(jobs)

    again = space.queue_cmd(b, "claim", via_shell=True)
    assert again.returncode == 0 and again.stdout.strip() == first, again
    by_root = root_ctx(space.storage, "queue", "recover", "-p", SPACE, "--json")
    assert by_root.returncode == 0, by_root
    assert [r["job"] for r in json.loads(by_root.stdout)["requeued"]] == [first]
    requeued = space.queue / "pending" / first
    assert owner(requeued)[1] == space.people.gid and mode(requeued) & 0o060 == 0o060

    with process_of(b) as desk:
        for expected in (first, second):
            claimed = space.queue_cmd(b, "claim", "--pid", str(desk.pid))
            assert claimed.returncode == 0 and claimed.stdout.strip() == expected, claimed
        # docs/queue.md: one member's claim may be finished by another.
        failed = space.queue_cmd(a, "finish", first, "--error", "-", stdin='"disk on fire"')
        assert failed.returncode == 0, failed
        ok = space.queue_cmd(b, "finish", second, "--ok", "-", stdin="{}")
        assert ok.returncode == 0, ok
    empty = space.queue_cmd(a, "claim")
    assert (empty.returncode, empty.stdout) == (3, ""), empty

    assert space.entries("failed") == sorted([first, f"{first}.result"])
    assert space.entries("done") == sorted([second, f"{second}.result"])
    for state in ("pending", "claimed", "lease", "inbox"):
        assert space.entries(state) == [], state
    error = json.loads((space.queue / "failed" / f"{first}.result").read_text())
    assert (error["status"], error["output"]) == ("error", "disk on fire")
    settled = space.queue_cmd(b, "recover", "--reconcile", "--json")
    assert settled.returncode == 0 and json.loads(settled.stdout)["consistent"] is True


def test_a_state_directory_a_member_remade_is_reported_until_root_gives_it_back(
    space: Space,
) -> None:
    """§2.4 ``owned_by_others``, X-1: in a queue of the older layout (``queue/`` not sticky) B
    remakes ``failed/`` as its own; ``status`` names it (exit 0) and the queue works on; once B
    closes it every member is refused with EACCES naming it; ``ctx shared create --group``
    refuses to repair another owner's directory (EPERM, nothing changed) until root chowns it
    back, then restores the sticky queue and B can no longer take the directory away."""
    a, b = space.people.a, space.people.b
    failed = space.queue / "failed"
    space.queue.chmod(0o2770)  # what an older version made
    remade = subprocess.run(["sh", "-c", f"umask 002 && rmdir {failed} && mkdir {failed}"],
                            user=b.uid, group=b.gid, extra_groups=b.groups)  # fmt: skip
    assert remade.returncode == 0
    assert owner(failed) == (b.uid, space.people.gid)

    status = space.queue_cmd(a, "status", "--json")
    assert status.returncode == 0, status
    others = json.loads(status.stdout)["owned_by_others"]
    assert [(o["path"], o["uid"], o["queue_owner"]) for o in others] == [("failed", b.uid, 0)]
    assert f"chown 0 {failed}" in others[0]["remedy"]
    text = space.queue_cmd(a, "status")
    assert text.returncode == 0, text
    assert f"owner      failed/: owned by uid {b.uid}, not by uid 0" in text.stdout, text.stdout

    published = space.queue_cmd(a, "publish", "--name", "broken", "-", stdin=request("/x"))
    assert published.returncode == 0, published
    with process_of(a) as desk:
        job = space.queue_cmd(a, "claim", "--pid", str(desk.pid)).stdout.strip()
        assert job == "broken.req.json"
        closed = subprocess.run(["chmod", "2700", str(failed)], user=b.uid, group=b.gid,
                                extra_groups=b.groups)  # fmt: skip
        assert closed.returncode == 0
        before = snapshot(space.queue)
        refused = space.queue_cmd(a, "finish", job, "--error", "-", stdin='"no"')
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("ctx: EACCES: "), refused.stderr
        assert str(failed) in refused.stderr and f"owner uid {b.uid}" in refused.stderr
        assert snapshot(space.queue) == before

        repair = root_ctx(space.storage, "shared", "create", SPACE, "--group", GROUP)
        assert repair.returncode == 1, repair
        assert repair.stderr.startswith("ctx: EPERM: "), repair.stderr
        assert f"chown 0 {failed}" in repair.stderr
        assert mode(space.queue) == 0o2770 and mode(failed) == 0o2700  # nothing changed

        os.chown(failed, 0, -1)  # the remedy both messages name
        repair = root_ctx(space.storage, "shared", "create", SPACE, "--group", GROUP)
        assert repair.returncode == 0, repair
        assert f"repaired  {failed}" in repair.stdout, repair.stdout
        assert (mode(space.queue), mode(failed)) == (0o3770, 0o2770)
        assert owner(failed) == (0, space.people.gid)

        done = space.queue_cmd(a, "finish", job, "--error", "-", stdin='"no"')
        assert done.returncode == 0, done
    status = json.loads(space.queue_cmd(b, "status", "--json").stdout)
    assert status["owned_by_others"] == [] and status["failed"] == 1
    again = subprocess.run(["rmdir", str(space.queue / "pending")], user=b.uid, group=b.gid,
                           extra_groups=b.groups, capture_output=True)  # fmt: skip
    assert again.returncode != 0 and (space.queue / "pending").is_dir()


# ------------------------------------------------------------------------------ own roots


def test_a_user_without_root_works_a_root_of_their_own_that_others_cannot_reach(
    traversable_tmp: Path, people: People
) -> None:
    """R-1, R-4, §2.4, S-1: with no configuration A's ``ctx`` uses ``~/.local/share/cortexfs/
    storage/current``: A bootstraps it, works a queue, creates an agent running as A and runs a
    tool whose session lands in ``home/<A's uid>/``.  B (with ``XDG_DATA_HOME``) has a root of
    its own, and reaching A's through ``--storage`` or ``CTX_STORAGE`` is EACCES, nothing read."""
    a, b = people.a, people.b
    a_env = user_env(a, traversable_tmp)
    b_env = user_env(b, traversable_tmp, XDG_DATA_HOME=str(b.home(traversable_tmp) / "data"))
    a_root = a.home(traversable_tmp) / ".local" / "share" / "cortexfs" / "storage" / "current"
    b_root = b.home(traversable_tmp) / "data" / "cortexfs" / "storage" / "current"

    boot = as_user(a, a_env, "bootstrap")
    assert boot.returncode == 0, boot
    assert set(os.listdir(a_root)) == ROOT_ENTRIES
    assert owner(a_root)[0] == a.uid and mode(a_root.parents[2]) == 0o700  # ~/.local/share
    assert as_user(a, a_env, "queue", "init", "-p", "mine").returncode == 0
    assert set(os.listdir(a_root / "shared" / "mine" / "queue")) >= QUEUE_SUBDIRS
    job = as_user(a, a_env, "queue", "publish", "-p", "mine", "--name", "own", "-",
                  stdin=request("/"))  # fmt: skip
    assert job.returncode == 0 and job.stdout == "own.req.json\n", job
    claimed = as_user(a, a_env, "queue", "claim", "-p", "mine", "--pid", "1")
    assert claimed.stdout == "own.req.json\n", claimed
    assert as_user(a, a_env, "queue", "finish", "-p", "mine", "own", "--ok").returncode == 0
    assert os.listdir(a_root / "shared" / "mine" / "queue" / "done") != []

    agent = json.dumps({"name": "helper", "label": "helper_t", "tools": ["fs.stat"]})
    made = as_user(a, a_env, "agent", "create", "-", stdin=agent)
    assert made.returncode == 0 and f"(uid {a.uid}, gid {a.gid})" in made.stdout, made
    allow = subprocess.run(["sh", "-c", 'echo "allow helper_t tool:fs.stat execute" >> "$0"',
                            str(a_root / "tool" / "fs.stat.d" / "policy")],
                           user=a.uid, group=a.gid)  # fmt: skip
    assert allow.returncode == 0
    ran = as_user(a, a_env, "run", "--agent", "helper", "--native", "fs.stat",
                  stdin='{"path": "/ctx/shared"}')  # fmt: skip
    assert ran.returncode == 0, ran
    events_path = a_root / "home" / str(a.uid) / "agent" / "helper" / "session" / "default"
    events_path = events_path / "events.jsonl"
    assert owner(events_path) == (a.uid, a.gid) and mode(events_path) == 0o600
    shown = as_user(a, a_env, "session", "show", "helper", "--json")
    assert shown.returncode == 0, shown
    types = [json.loads(line)["type"] for line in shown.stdout.splitlines()]
    assert types == ["tool_call", "tool_result"]

    before = snapshot(a_root)
    mine = as_user(b, b_env, "queue", "status", "-p", "mine")
    assert mine.returncode == 1 and f"ENOENT: no queue at {b_root}" in mine.stderr, mine
    for how, env, extra in (
        ("--storage", b_env, ["--storage", str(a_root)]),
        ("CTX_STORAGE", {**b_env, "CTX_STORAGE": str(a_root)}, []),
    ):
        for args in (
            ["queue", "status", "-p", "mine"],
            ["queue", "claim", "-p", "mine"],
            ["session", "show", "helper"],
        ):
            refused = as_user(b, env, *args, *extra)
            assert refused.returncode == 1, (how, refused)
            assert refused.stderr.startswith("ctx: EACCES: "), (how, refused.stderr)
            assert refused.stdout == "", (how, refused.stdout)
            if args[0] == "queue":  # docs/queue.md: the directory that refused, and what to do
                assert f"uid {b.uid} may not enter {a_root.parents[3]}" in refused.stderr
                assert f"yours is {b_root}" in refused.stderr, (how, refused.stderr)
    assert snapshot(a_root) == before

    own = as_user(b, b_env, "queue", "init", "-p", "mine")
    assert own.returncode == 0, own
    assert (b_root / "shared" / "mine" / "queue" / "pending").is_dir()
    assert owner(b_root)[0] == b.uid
    assert snapshot(a_root) == before


def test_reading_sessions_of_a_root_one_may_not_enter_says_which_directory_and_what_to_do(
    traversable_tmp: Path, people: People
) -> None:
    """R-1, S-1, README (errors read ``ctx: ERRNO: what to do``): B pointing ``ctx session``
    at A's private root is refused as ``ctx queue`` refuses it: EACCES naming the directory on
    the way that B may not enter (A's ``~/.local``) and B's own root to use instead."""
    a, b = people.a, people.b
    a_env = user_env(a, traversable_tmp)
    b_env = user_env(b, traversable_tmp)
    assert as_user(a, a_env, "bootstrap").returncode == 0
    a_root = a.home(traversable_tmp) / ".local" / "share" / "cortexfs" / "storage" / "current"
    b_root = b.home(traversable_tmp) / ".local" / "share" / "cortexfs" / "storage" / "current"
    for verb in ("show", "list"):
        refused = as_user(b, b_env, "session", verb, "helper", "--storage", a_root)
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("ctx: EACCES: "), refused.stderr
        assert f"uid {b.uid} may not enter {a_root.parents[3]}" in refused.stderr, refused.stderr
        assert f"yours is {b_root}" in refused.stderr, refused.stderr


# ------------------------------------------------------------------------------ sessions


def agent_request(name: str, permissions: list[str]) -> str:
    return json.dumps({"name": name, "label": f"{name}_t", "tools": ["fs.read"],
                       "shared": {SPACE: permissions}})  # fmt: skip


def make_agent(space: Space, name: str, user: Person, permissions: list[str]) -> None:
    """Root creates ``name`` running as ``user`` (with that user's groups) and lets its label
    execute ``fs.read`` in the tool's own policy too (P-6)."""
    made = root_ctx(space.storage, "agent", "create", "--user", user.name, "-",
                    stdin=agent_request(name, permissions))  # fmt: skip
    assert made.returncode == 0, made
    with open(space.storage / "tool" / "fs.read.d" / "policy", "a") as policy:
        policy.write(f"allow {name}_t tool:fs.read execute\n")


def run_in_space(space: Space, agent: str, session: str = "default") -> subprocess.CompletedProcess:
    return root_ctx(space.storage, "run", "--agent", agent, "--project", SPACE, "--session",
                    session, "--native", "fs.read",
                    stdin=json.dumps({"path": f"/ctx/shared/{SPACE}/data/plan.txt"}))  # fmt: skip


def last_frame(run: subprocess.CompletedProcess) -> dict:
    return json.loads(run.stdout.splitlines()[-1])


def test_a_members_agent_records_in_the_space_the_other_member_reads_it_and_others_cannot(
    space: Space,
) -> None:
    """S-1, S-6, X-1, S-2: B writes a plan in ``data/``; A's agent (root made it with A's
    identity) reads it and records ``shared/proj/agent/coder/session/review/events.jsonl``,
    owned by A, the space's group, 3770/0660; B reads that session with ``ctx session show
    --project`` and on disk but cannot rename or remove it; the outsider sees nothing, and
    neither the outsider's agent (granted write) nor B's read-only agent may record there."""
    a, b, outsider = space.people.a, space.people.b, space.people.outsider
    plan = space.dir / "data" / "plan.txt"
    wrote = subprocess.run(["sh", "-c", f"echo 'ship it' > {plan}"], user=b.uid, group=b.gid,
                           extra_groups=b.groups, umask=0o002)  # fmt: skip
    assert wrote.returncode == 0 and owner(plan) == (b.uid, space.people.gid)

    make_agent(space, "coder", a, ["read", "write"])
    ran = run_in_space(space, "coder", "review")
    assert ran.returncode == 0, ran
    frame = last_frame(ran)
    assert frame["status"] == "ok" and frame["output"]["content"] == "ship it\n", frame
    session = space.dir / "agent" / "coder" / "session" / "review"
    assert frame["session"] == f"shared/{SPACE}/agent/coder/session/review"
    for directory in (session.parent.parent, session.parent, session):
        assert owner(directory) == (a.uid, space.people.gid), directory
        assert mode(directory) == 0o3770, f"{directory}: {mode(directory):o}"
    events = session / "events.jsonl"
    assert owner(events) == (a.uid, space.people.gid) and mode(events) == 0o660
    on_disk = [json.loads(line) for line in events.read_text().splitlines()]

    shown = space.ctx(b, "session", "show", "coder", "review", "--project", SPACE, "--json")
    assert shown.returncode == 0, shown
    seen = [json.loads(line) for line in shown.stdout.splitlines()]
    assert seen == on_disk
    assert [(e["type"], e["agent"], e["session"], e["object"], e["status"]) for e in seen] == [
        ("tool_call", "coder", "review", "tool/fs.read", "ok"),
        ("tool_result", "coder", "review", "tool/fs.read", "ok"),
    ]
    listed = space.ctx(b, "session", "list", "coder", "--project", SPACE, "--json")
    assert listed.returncode == 0 and [s["name"] for s in json.loads(listed.stdout)] == ["review"]
    for argv in (["mv", str(session), f"{session}.gone"], ["rm", "-f", str(events)]):
        took = subprocess.run(argv, user=b.uid, group=b.gid, extra_groups=b.groups,
                              capture_output=True)  # fmt: skip
        assert took.returncode != 0, argv
    assert events.is_file()

    for args in (["session", "show", "coder", "review"], ["session", "list", "coder"]):
        refused = space.ctx(outsider, *args, "--project", SPACE)
        assert_refused_outsider(refused, space)
    peek = subprocess.run(["ls", str(session)], user=outsider.uid, group=outsider.gid,
                          extra_groups=outsider.groups, capture_output=True)  # fmt: skip
    assert peek.returncode != 0

    before = snapshot(space.dir)
    make_agent(space, "spy", outsider, ["read", "write"])
    spied = run_in_space(space, "spy")
    assert spied.returncode == 1, spied
    error = last_frame(spied)["error"]
    assert (error["error"], error["step"]) == ("EACCES", 2), error  # P-5 step 2: mode bits
    make_agent(space, "reader", b, ["read"])
    read_only = run_in_space(space, "reader")
    assert read_only.returncode == 1, read_only
    assert last_frame(read_only)["error"]["error"] == "EACCES"
    assert snapshot(space.dir) == before
    assert sorted(os.listdir(space.dir / "agent")) == ["coder"]


def test_a_place_another_member_made_for_an_agent_is_refused_until_root_clears_it(
    space: Space,
) -> None:
    """S-6, X-1 (docs/sessions.md): B makes ``agent/late/`` in the space before A's agent
    ``late`` first records there; the agent's call is refused with EACCES naming the directory
    and B's uid, and nothing is made where B could read or rewrite it; once root removes it, the
    agent's next call records in a place of its own."""
    a, b = space.people.a, space.people.b
    (space.dir / "data" / "plan.txt").write_text("plan\n")
    squatted = space.dir / "agent" / "late"
    made = subprocess.run(["mkdir", str(squatted)], user=b.uid, group=b.gid,
                          extra_groups=b.groups)  # fmt: skip
    assert made.returncode == 0
    make_agent(space, "late", a, ["read", "write"])

    refused = run_in_space(space, "late")
    assert refused.returncode == 1, refused
    error = last_frame(refused)["error"]
    assert error["error"] == "EACCES", error
    assert f"{squatted} belongs to uid {b.uid}" in error["message"], error
    assert list(squatted.iterdir()) == []  # nothing made in B's directory
    assert owner(squatted)[0] == b.uid

    shutil.rmtree(squatted)  # the host administrator, after reading what it holds
    ran = run_in_space(space, "late")
    assert ran.returncode == 0, ran
    assert owner(squatted) == (a.uid, space.people.gid) and mode(squatted) == 0o3770
    events = squatted / "session" / "default" / "events.jsonl"
    assert [json.loads(line)["type"] for line in events.read_text().splitlines()] == [
        "tool_call",
        "tool_result",
    ]
