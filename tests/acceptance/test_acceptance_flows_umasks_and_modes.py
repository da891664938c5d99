"""The modes, owners and groups that ctx leaves behind when it runs under unusual umasks
(``umask 000``, ``077``, ``027``, ``002``), as root and as real members of a space's group
(SPEC R-2, R-5, X-1, Q-1…Q-5, S-1, S-5, T-7, T-8, A-2, A-3; docs/queue.md "A queue shared by a
group", docs/sessions.md "Where sessions live" and "Shared spaces", docs/tools.md "Modes,
whatever the umask" and "the terminal socket").  What is checked is what the modes mean in
use: a member works a job another member published, claimed or finished under ``umask 077``;
an outsider reads nothing of the space; nothing is writable by others that should not be;
setgid directories keep the space's group; ``ctx queue status`` names a state directory that
would not give it (``group_not_inherited``) or belongs to a member (``owned_by_others``); an
agent's uid reaches its own terminal whatever umask root started it under.

The terminals are started in a private mount namespace over a fresh tmpfs ``/run``, so that
what they make there is made anew by the start under test and is seen by nobody else."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    Run,
    clean_env,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.terminalcli import CoderHost, coder_host
from tests.support.storage import copy_of_root
from tests.support.users import (
    UnprivilegedUser,
    access_as,
    members_of,
    process_of,
    users_named,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as several users")

MEMBER_A, MEMBER_B, OUTSIDER, GROUP = "ctxumask-a", "ctxumask-b", "ctxumask-o", "ctxumask-g"
SPACE = "p"
SCRATCH = scratch_top(__file__)
CTX = CTX_ARGV[0]
JOB = json.dumps({"tool": "fs.stat", "input": {"path": "/ctx"}})


# ------------------------------------------------------------------------------ helpers


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def owner(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid


def every_entry(top: Path) -> list[Path]:
    """Every entry below ``top`` (``top`` included), never following a link."""
    found = [top]
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        found.extend(Path(dirpath, name) for name in dirnames + filenames)
    return found


def layout(top: Path) -> dict[str, tuple]:
    """Each entry below ``top`` by relative path: its kind, mode, owner and group (a link: its
    target), what a root made under another umask must repeat exactly."""
    shape: dict[str, tuple] = {}
    for path in every_entry(top):
        info = os.lstat(path)
        rel = str(path.relative_to(top))
        if stat.S_ISLNK(info.st_mode):
            shape[rel] = ("link", os.readlink(path))
        else:
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
            shape[rel] = (kind, oct(stat.S_IMODE(info.st_mode)), info.st_uid, info.st_gid)
    return shape


def run(
    argv: list,
    *,
    umask: int,
    env: dict[str, str],
    who: UnprivilegedUser | None = None,
    stdin: str = "",
    cwd: Path | str = "/",
) -> Run:
    """``argv`` under ``umask``, as ``who`` with the groups the group database gives it
    (None: root)."""
    ids = {} if who is None else {"user": who.uid, "group": who.gid, "extra_groups": who.groups}
    done = subprocess.run([str(a) for a in argv], input=stdin, capture_output=True, text=True,
                          env=env, cwd=cwd, umask=umask, timeout=90, **ids)  # fmt: skip
    return Run([str(a) for a in argv[1:]], done.returncode, done.stdout, done.stderr)


def ok(result: Run) -> Run:
    assert result.rc == 0 and "Traceback" not in result.err, result
    return result


# ------------------------------------------------------------------------------ the world


@dataclass(frozen=True)
class People:
    a: UnprivilegedUser
    b: UnprivilegedUser
    outsider: UnprivilegedUser
    gid: int


@pytest.fixture(scope="module")
def people() -> People:
    (a, b), gid = members_of(GROUP, MEMBER_A, MEMBER_B)
    (outsider,) = users_named(OUTSIDER)
    if gid in outsider.groups:
        pytest.skip(f"{OUTSIDER} is a member of {GROUP}")
    return People(a, b, outsider, gid)


@dataclass
class World:
    top: Path
    storage: Path
    people: People

    @property
    def space(self) -> Path:
        return self.storage / "shared" / SPACE

    @property
    def queue(self) -> Path:
        return self.space / "queue"

    def env(self, who: UnprivilegedUser | None = None) -> dict[str, str]:
        """Root's environment (its hint cache in the scratch directory), or a member's with
        a home of its own there."""
        env = {k: v for k, v in clean_env(CTX_STORAGE=str(self.storage)).items()
               if not k.startswith("XDG_")}  # fmt: skip
        if who is None:
            env.update(HOME="/root", XDG_CACHE_HOME=str(self.top / "cache-root"))
            return env
        home = self.top / f"home-{who.name}"
        if not home.exists():
            home.mkdir()
            os.chown(home, who.uid, who.gid)
            home.chmod(0o755)
        env.update(HOME=str(home), USER=who.name, LOGNAME=who.name)
        return env

    def ctx(self, umask: int, *args, who: UnprivilegedUser | None = None, **kw) -> Run:
        return run([CTX, *args], umask=umask, env=self.env(who), who=who, **kw)

    def queue_cmd(self, umask: int, who: UnprivilegedUser | None, verb: str, *args, **kw) -> Run:
        return self.ctx(umask, "queue", verb, "--project", SPACE, *args, who=who, **kw)

    def may(self, who: UnprivilegedUser, path: Path, rwx: str) -> bool:
        (answer,) = access_as(who, [(str(path), rwx)], who.groups)
        return answer


@pytest.fixture
def world(_template: Path, people: People) -> Iterator[World]:
    """A bootstrapped root every uid may search, and space ``p`` that root made for
    ``ctxumask-g`` with ``ctx shared create p --group ctxumask-g`` (default umask)."""
    top = new_scratch_dir(SCRATCH, "w")
    storage = copy_of_root(_template, top / "storage")
    made = World(top, storage, people)
    ok(made.ctx(0o022, "shared", "create", SPACE, "--group", GROUP))
    try:
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


def queue_is_the_groups(world: World) -> None:
    """docs/queue.md: every entry of the queue carries the space's group, each directory is
    setgid and gives the group rwx, each file gives it rw, and none is writable by others."""
    wrong = []
    for path in every_entry(world.queue):
        info = os.lstat(path)
        bits = stat.S_IMODE(info.st_mode)
        wanted = 0o2070 if stat.S_ISDIR(info.st_mode) else 0o060
        if path.name == "config":
            wanted = 0o040
        if info.st_gid != world.people.gid or bits & wanted != wanted or bits & 0o002:
            wrong.append(f"{path.relative_to(world.queue)} {bits:o} gid {info.st_gid}")
    assert wrong == []


# ------------------------------------------------------------------------------ roots, spaces


def test_bootstrap_and_shared_create_leave_one_layout_whatever_the_umask(
    tmp_path: Path, people: People
) -> None:
    """R-2, R-5, X-1 (docs/tools.md "Modes, whatever the umask"; docs/sessions.md "Shared
    spaces"): ``ctx bootstrap`` run by root under umask 000 and under 077 (between them,
    every bit a umask can take) leaves the very same modes, owners and groups, and so does
    ``ctx shared create NAME --group G`` under 000 and 077: the root and its six directories
    0755, the bundle 0755/0444, core tools 0755 with controls 0644 and log 0640, and a space
    03770 (``agent/``, ``queue/`` too), ``data/`` and the six queue directories 02770,
    ``tool/`` 02750, all of the space's group."""
    top = new_scratch_dir(SCRATCH, "b")
    try:
        roots = {umask: top / f"root{umask:03o}" for umask in (0o000, 0o077)}
        booting = [
            subprocess.Popen([CTX, "bootstrap"], umask=umask, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True,
                             env=clean_env(CTX_STORAGE=str(root),
                                           XDG_CACHE_HOME=str(tmp_path / "c")))
            for umask, root in roots.items()
        ]  # fmt: skip
        for boot in booting:
            _, err = boot.communicate(timeout=120)
            assert boot.returncode == 0 and "Traceback" not in err, err
        made, other = layout(roots[0o000]), layout(roots[0o077])
        differing = {k: (made.get(k), v) for k, v in other.items() if made.get(k) != v}
        assert differing == {} and made.keys() == other.keys(), differing

        root = roots[0o077]
        env = clean_env(CTX_STORAGE=str(root), XDG_CACHE_HOME=str(tmp_path / "c"))
        spaces = {}
        for umask in (0o000, 0o077):
            name = f"s{umask:03o}"
            ok(run([CTX, "shared", "create", name, "--group", GROUP], umask=umask, env=env))
            spaces[umask] = layout(root / "shared" / name)
        assert all(shape == spaces[0o000] for shape in spaces.values()), spaces

        root = top / "root077"
        assert {mode(root / e) for e in ROOT_ENTRIES} | {mode(root)} == {0o755}
        assert mode(root / "tool/fs.stat") == 0o755
        assert mode(root / "tool/fs.stat.d/policy") == 0o644
        assert mode(root / "tool/fs.stat.d/log") == 0o640
        docs = root / "shared/cortexfs-docs"
        assert {mode(p) for p in every_entry(docs) if p.is_dir()} == {0o755}
        assert {mode(p) for p in every_entry(docs) if p.is_file()} == {0o444}
        space = root / "shared" / "s077"
        expected = {"": 0o3770, "agent": 0o3770, "queue": 0o3770, "data": 0o2770, "tool": 0o2750}
        expected.update({f"queue/{d}": 0o2770 for d in QUEUE_SUBDIRS})
        for rel, wanted in expected.items():
            assert (mode(space / rel), owner(space / rel)) == (wanted, (0, people.gid)), rel
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ the queue


def test_members_under_unusual_umasks_work_each_others_jobs(world: World) -> None:
    """Q-1…Q-5, X-1 (docs/queue.md "A queue shared by a group"): member A publishes under
    umask 077, member B claims under 000, A claims under 027 for a holder that is gone, B
    recovers that claim under 077, A finishes B's claim under 077 and B drains the rest under
    002.  Every entry the protocol made is the space's group's, setgid directories with the
    group's rwx and files with its rw, none writable by others; each member reads the other's
    results; the outsider is refused by ctx and by the kernel; each member's claim-order hint
    is 0600 in a 0700 directory."""
    a, b, outsider = world.people.a, world.people.b, world.people.outsider
    ok(world.queue_cmd(0o077, a, "publish", "--name", "first", "-", stdin=JOB))
    batch = ok(world.queue_cmd(0o077, a, "publish", "--batch", "-", stdin=f"{JOB}\n{JOB}\n"))
    assert len(batch.lines()) == 2, batch

    with process_of(b) as holder:
        mine = ok(world.queue_cmd(0o000, b, "claim", "--pid", str(holder.pid))).out.strip()
        for path in (world.queue / "claimed" / mine, world.queue / "lease" / mine):
            assert owner(path) == (b.uid, world.people.gid), path
        queue_is_the_groups(world)

        gone = subprocess.Popen(["true"])
        gone.wait()
        abandoned = world.queue_cmd(0o027, a, "claim", "--pid", str(gone.pid))
        left = ok(abandoned).out.strip()
        queue_is_the_groups(world)
        recovered = ok(world.queue_cmd(0o077, b, "recover"))
        assert f"requeue  {left}" in recovered.out, recovered
        assert (world.queue / "pending" / left).is_file()

        finished = world.queue_cmd(0o077, a, "finish", mine, "--ok", "-", stdin='{"by": "a"}')
        ok(finished)

    drained = []
    while (claim := world.queue_cmd(0o002, b, "claim", "--pid", str(os.getpid()))).rc == 0:
        job = claim.out.strip()
        ok(world.queue_cmd(0o002, b, "finish", job, "--ok", "-", stdin='{"by": "b"}'))
        drained.append(job)
    assert claim.rc == 3, claim
    published = {"first.req.json", *batch.lines()}
    assert {mine, *drained} == published and len(drained) == 2, drained
    assert {p.name for p in (world.queue / "done").iterdir()} == published | {
        f"{job}.result" for job in published
    }

    queue_is_the_groups(world)
    results = sorted((world.queue / "done").glob("*.result"))
    assert len(results) == 3
    for result in results:
        assert world.may(a, result, "r") and world.may(b, result, "r"), result
        assert not world.may(outsider, result, "r"), result
    status = world.queue_cmd(0o022, outsider, "status")
    assert status.rc == 1 and status.err.startswith("ctx: EACCES: "), status

    for who in (a, b):
        hints = world.top / f"home-{who.name}" / ".cache/cortexfs/claim-order"
        assert mode(hints) == 0o700, who.name
        assert {mode(p) for p in hints.iterdir()} == {0o600}, who.name


def test_a_state_directory_that_lost_setgid_is_named_and_locks_the_other_member_out(
    world: World,
) -> None:
    """docs/queue.md ("One that lost its setgid bit … gives what a member makes in it the
    maker's own group"): with ``inbox/`` no longer setgid, A's request made there under umask
    077 has A's own group, B's claim leaves it pending (exit 3, a note naming it), and
    ``ctx queue status`` names ``inbox/`` on a ``group`` line and under
    ``group_not_inherited`` (exit 0).  Once ``chmod g+s`` is done, the next request is the
    group's and B claims it."""
    a, b = world.people.a, world.people.b
    inbox = world.queue / "inbox"
    inbox.chmod(0o770)
    stuck = ok(world.queue_cmd(0o077, a, "publish", "--name", "stuck", "-", stdin=JOB)).out
    assert owner(world.queue / "pending" / stuck.strip()) == (a.uid, a.gid)

    claim = world.queue_cmd(0o077, b, "claim")
    assert claim.rc == 3 and claim.out == "", claim
    assert "ctx: note: " in claim.err and "stuck.req.json" in claim.err, claim

    text = ok(world.queue_cmd(0o077, b, "status"))
    named = (
        "group      inbox/: is not setgid, so what members make in it gets the maker's own "
        f"group, not the queue's gid {world.people.gid}"
    )
    assert named in text.out, text
    assert f"chmod g+s {inbox}" in text.out, text
    listed = ok(world.queue_cmd(0o077, b, "status", "--json")).json()["group_not_inherited"]
    assert [(e["path"], e["setgid"], e["queue_gid"]) for e in listed] == [
        ("inbox", False, world.people.gid)
    ], listed

    inbox.chmod(0o2770)
    fine = ok(world.queue_cmd(0o077, a, "publish", "--name", "fine", "-", stdin=JOB)).out
    assert owner(world.queue / "pending" / fine.strip()) == (a.uid, world.people.gid)
    claimed = ok(world.queue_cmd(0o077, b, "claim", "--pid", str(os.getpid())))
    assert claimed.out.strip() == "fine.req.json", claimed
    assert ok(world.queue_cmd(0o022, b, "status", "--json")).json()["group_not_inherited"] == []


def test_a_state_directory_a_member_remade_is_the_groups_and_listed_as_owned_by_others(
    world: World,
) -> None:
    """docs/queue.md (init: "a missing directory is made as ctx shared create makes it: with
    the group the space has … and mode 02770"; status: ``owned_by_others``): ``done/`` and
    ``failed/`` gone, member B's ``ctx queue init`` under umask 077 makes them 02770 with the
    space's group; ``ctx queue status`` lists each on an ``owner`` line and under
    ``owned_by_others`` (exit 0), and member A still finishes a job into the new ``done/``
    and B reads its result."""
    a, b = world.people.a, world.people.b
    for state in ("done", "failed"):
        (world.queue / state).rmdir()
    ok(world.queue_cmd(0o077, b, "init"))
    for state in ("done", "failed"):
        path = world.queue / state
        assert (mode(path), owner(path)) == (0o2770, (b.uid, world.people.gid)), state

    status = ok(world.queue_cmd(0o022, a, "status"))
    assert f"owner      done/: owned by uid {b.uid}, not by uid 0" in status.out, status
    others = ok(world.queue_cmd(0o022, a, "status", "--json")).json()["owned_by_others"]
    assert sorted((o["path"], o["uid"], o["queue_owner"]) for o in others) == [
        ("done", b.uid, 0),
        ("failed", b.uid, 0),
    ], others

    job = ok(world.queue_cmd(0o077, a, "publish", "-", stdin=JOB)).out.strip()
    ok(world.queue_cmd(0o077, a, "claim", "--pid", str(os.getpid())))
    ok(world.queue_cmd(0o077, a, "finish", job, "--ok", "-", stdin="{}"))
    assert world.may(b, world.queue / "done" / f"{job}.result", "r")
    queue_is_the_groups(world)


# ------------------------------------------------------------------------------ calls, sessions


def test_root_under_umask_077_works_jobs_and_records_sessions_with_documented_modes(
    world: World,
) -> None:
    """W-1, S-1, S-5, T-7, X-1 (docs/sessions.md "Where sessions live"): root under umask 077
    makes agent ``w`` (uid of member A), works a job member B published, and runs a call in a
    shared session and one (under 000) in a home session.  B reads the job's result; the
    shared session is 03770 with ``events.jsonl`` 0660, A's uid and the space's group, which B
    may read and the outsider may not; the home sessions are 0700/0600 below a 0755
    ``home/<uid>``, which not even B reads; the tool's log stays 0640; ``ctx session repair``
    under umask 000 cuts a torn line and keeps the session's modes."""
    a, b, outsider = world.people.a, world.people.b, world.people.outsider
    request = {
        "name": "w",
        "label": "w_t",
        "tools": ["fs.stat"],
        "shared": {SPACE: ["read", "write"]},
    }
    ok(world.ctx(0o077, "agent", "create", "-", "--user", a.name, stdin=json.dumps(request)))
    with (world.storage / "tool/fs.stat.d/policy").open("a") as policy:
        policy.write("allow w_t tool:fs.stat execute\n")

    job = ok(world.queue_cmd(0o077, b, "publish", "-", stdin=JOB)).out.strip()
    worked = ok(world.queue_cmd(0o077, None, "work", "--agent", "w", "--drain"))
    result = world.queue / "done" / f"{job}.result"
    assert result.is_file(), worked
    assert owner(result)[1] == world.people.gid and world.may(b, result, "r")

    ok(world.ctx(0o077, "run", "--agent", "w", "--project", SPACE, "--session", "s",
                 "fs.stat", "/ctx"))  # fmt: skip
    ok(world.ctx(0o000, "run", "--agent", "w", "--session", "h", "fs.stat", "/ctx"))

    shared = world.space / "agent/w/session/s"
    for directory in (shared.parent.parent, shared.parent, shared):
        assert (mode(directory), owner(directory)) == (0o3770, (a.uid, world.people.gid))
    events = shared / "events.jsonl"
    assert (mode(events), owner(events)) == (0o660, (a.uid, world.people.gid))
    assert world.may(b, events, "r") and not world.may(outsider, events, "r")

    home = world.storage / "home" / str(a.uid)
    assert (mode(home), owner(home)) == (0o755, (a.uid, a.gid))
    below = every_entry(home)[1:]
    assert {mode(p) for p in below if p.is_dir()} == {0o700}
    assert {mode(p) for p in below if p.is_file()} == {0o600}
    assert {owner(p) for p in below} == {(a.uid, a.gid)}
    assert not world.may(b, home / "agent/w/session/h/events.jsonl", "r")
    assert mode(world.storage / "tool/fs.stat.d/log") == 0o640

    with events.open("a") as torn:
        torn.write('{"type": "tool_call", "torn')
    repaired = ok(world.ctx(0o000, "session", "repair", "w", "s", "--project", SPACE))
    assert "truncated" in repaired.out, repaired
    assert (mode(events), owner(events)) == (0o660, (a.uid, world.people.gid))


def test_installs_and_agents_made_under_unusual_umasks_pass_the_chain(world: World) -> None:
    """T-8, A-3, P-5 step 4 (docs/tools.md: controls root-owned 0644, logs 0640): tools
    installed by root into the system, user and ``shared:p`` tiers under umask 000, into the
    space's under 077 and the system one under 002, and an agent created under 002, leave nothing
    writable by a group or by others (which the chain would refuse as not host-owned):
    executables 0755, control directories 0755, controls 0644, logs 0640; the agent (a
    member's uid) runs the space's tool installed under 077 and the system one installed
    under 002."""
    a = world.people.a
    program = "#!/bin/sh\necho '{\"ran\": true}'\n"
    tiers = {"system": "s", f"shared:{SPACE}": "p", "user": "u"}
    plan = [(0o000, "system"), (0o000, f"shared:{SPACE}"), (0o000, "user")]
    plan += [(0o077, f"shared:{SPACE}"), (0o002, "system")]
    installed = {}
    for umask, tier in plan:
        name = f"{tiers[tier]}{umask:03o}"
        manifest = tool_manifest(world.top / "manifests", name, program)
        done = ok(world.ctx(umask, "object", "install", str(manifest), "--tier", tier))
        installed[name] = Path(done.out.strip().rsplit(": ", 1)[1])

    for name, executable in installed.items():
        assert (mode(executable), owner(executable)[0]) == (0o755, 0), name
        # A space's tool/ is setgid: the directories made in it keep that bit.
        in_space = executable.parent.stat().st_mode & stat.S_ISGID
        for path in every_entry(executable.with_name(f"{name}.d")):
            bits = mode(path)
            wanted = (0o755 | in_space) if path.is_dir() else 0o640 if path.name == "log" else 0o644
            assert bits == wanted and owner(path)[0] == 0, (path, oct(bits))

    callable_ = ["p077", "s002"]  # a space's tool made under 077, a system one under 002
    request = {"name": "t", "label": "t_t", "tools": callable_, "shared": {SPACE: ["read"]}}
    ok(world.ctx(0o002, "agent", "create", "-", "--user", a.name, stdin=json.dumps(request)))
    controls = world.storage / "agent/t.d"
    assert {mode(p) for p in controls.iterdir() if p.name != "log"} == {0o644}
    assert (mode(controls / "log"), mode(controls), mode(world.storage / "agent/t")) == (
        0o640,
        0o755,
        0o755,
    )
    for name in callable_:
        with (installed[name].with_name(f"{name}.d") / "policy").open("a") as policy:
            policy.write(f"allow t_t tool:{name} execute\n")
        called = world.ctx(0o002, "run", "--agent", "t", name, "{}")
        assert called.rc == 0 and '"ran": true' in called.out, (name, called)


# ------------------------------------------------------------------------------ terminals


IN_FRESH_RUN = r"""
import json, os, stat, subprocess, sys

ctx, storage, session, umask, ws, agent_uid, agent_gid, other_uid, other_gid, premade, peer = (
    sys.argv[1:])
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
if premade == "yes":  # as an earlier start under the default umask left it
    os.mkdir("/run/cortexfs", 0o755)
    os.chmod("/run/cortexfs", 0o755)
env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CTX_STORAGE": storage}
facts = {}
started = subprocess.run([ctx, "agent", "start", "coder", "--session", session, "--json"],
                         cwd=ws, env=env, umask=int(umask, 8), capture_output=True, text=True,
                         timeout=90)
facts["start"] = [started.returncode, started.stdout, started.stderr]
try:
    if started.returncode == 0:
        info = json.loads(started.stdout)
        run_dir = os.path.dirname(info["listening_at"])
        places = {"base": "/run/cortexfs", "run_dir": run_dir, "pid": run_dir + "/pid",
                  "private": run_dir + "/private", "terminal": os.path.dirname(info["socket"])}
        facts["modes"] = {k: stat.S_IMODE(os.lstat(p).st_mode) for k, p in places.items()}

        def as_uid(uid, gid, argv):
            done = subprocess.run(argv, user=int(uid), group=int(gid), extra_groups=[],
                                  capture_output=True, text=True, timeout=60, cwd="/")
            return done

        for key, path in (("at_socket", info["listening_at"]), ("at_link", info["socket"])):
            done = as_uid(agent_uid, agent_gid, ["/usr/bin/python3", "-c", peer, path])
            facts[key] = json.loads(done.stdout) if done.returncode == 0 else done.stderr
        probe = ["/bin/sh", "-c", 'test -w "$1"', "sh", places["pid"]]
        facts["other_writes_pid"] = as_uid(other_uid, other_gid, probe).returncode == 0
finally:
    pid_file = os.path.join(os.path.dirname(json.loads(started.stdout or "{}").get(
        "listening_at", "/nonexistent/x")), "pid")
    held = open(pid_file).read().strip() if os.path.isfile(pid_file) else ""
    stop = [ctx, "agent", "stop", "coder", "--session", session]
    if subprocess.run(stop, env=env, capture_output=True, timeout=120).returncode != 0:
        if held.isdigit():  # a terminal that would not stop ends here, with the namespace
            os.kill(int(held), 9)
print(json.dumps(facts))
"""

# A watcher: enters the socket's directory (as the kernel lets its uid), connects, says
# "watch" and reads until tsh's prompt; {"errno": N} when refused on the way.
PEER = r"""
import json, os, socket, sys
path = sys.argv[1]
out = {}
s = socket.socket(socket.AF_UNIX)
try:
    os.chdir(os.path.dirname(path))
    s.connect(os.path.basename(path))
    s.sendall(b"watch\n")
    s.settimeout(20)
    data = b""
    while b"coder$ " not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    out["data"] = data.decode("latin-1")
except OSError as exc:
    out["errno"] = exc.errno
print(json.dumps(out))
"""


@pytest.fixture
def terminal_host(_template: Path, people: People) -> Iterator[CoderHost]:
    if shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"):
        pytest.skip("an agent terminal needs bubblewrap and /dev/fuse")
    if shutil.which("unshare") is None or not Path("/usr/bin/python3").exists():
        pytest.skip("needs unshare and /usr/bin/python3")
    with coder_host(_template, SCRATCH, ["fs.stat"], {}) as host:
        yield host


def terminal_in_a_fresh_run(
    host: CoderHost, umask: int, other: UnprivilegedUser, *, premade: bool = False
) -> dict:
    """``ctx agent start coder`` by root under ``umask`` in a mount namespace of its own whose
    ``/run`` is a new tmpfs (holding a 0755 ``/run/cortexfs`` already with ``premade``): the
    modes of what it made there and in the session, whether the agent's uid watches at the
    socket and through A-2's link, whether ``other`` may write the pid file; the terminal
    stopped before it returns."""
    argv = ["unshare", "--mount", "--propagation", "private",
            str(Path(CTX).with_name("python")), "-c", IN_FRESH_RUN,
            CTX, host.storage, f"u{umask:03o}", f"{umask:03o}", host.ws,
            host.uid, host.gid, other.uid, other.gid, "yes" if premade else "no",
            PEER]  # fmt: skip
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=240)
    if done.returncode != 0 and "mount" in done.stderr and "tmpfs" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["start"][0] == 0, facts["start"]
    return facts


def test_a_terminal_started_under_the_default_umask_is_reached_by_its_agent(
    terminal_host: CoderHost, people: People
) -> None:
    """A-2 (docs/tools.md "the terminal socket": root's directories 0711, the socket 0666,
    ``private/`` 0700; the agent's own uid may watch): under umask 022 the agent's uid
    watches at the socket and through the session's ``terminal/main.sock``, and no other uid
    may write the pid file ``ctx agent stop`` signals."""
    facts = terminal_in_a_fresh_run(terminal_host, 0o022, people.outsider)
    assert facts["modes"]["run_dir"] == 0o711 and facts["modes"]["private"] == 0o700, facts
    assert "coder$ " in facts["at_socket"].get("data", ""), facts
    assert "coder$ " in facts["at_link"].get("data", ""), facts
    assert facts["other_writes_pid"] is False, facts


def test_a_terminal_started_under_umask_000_keeps_its_pid_file_to_root(
    terminal_host: CoderHost, people: People
) -> None:
    """A-2, docs/tools.md ("the directories are root's …"; "a directory where the socket or
    the pid file belongs, which only root can put there"; "whoever owns it could swap the pid
    file a stop signals"): root starts the terminal under umask 000; the pid file that
    ``ctx agent stop`` reads and sends SIGTERM to must not be writable by another uid."""
    facts = terminal_in_a_fresh_run(terminal_host, 0o000, people.outsider)
    assert facts["modes"]["run_dir"] == 0o711 and facts["modes"]["private"] == 0o700, facts
    assert facts["modes"]["pid"] & 0o022 == 0, oct(facts["modes"]["pid"])
    assert facts["other_writes_pid"] is False, facts


def test_the_first_terminal_started_under_umask_077_is_watched_by_its_agent(
    terminal_host: CoderHost, people: People
) -> None:
    """A-2, docs/tools.md ("the directories are root's and searchable (0711) and the socket
    is 0666"; "the agent's own uid may watch"): with ``/run`` fresh, as after a boot, root
    starts the terminal under umask 077; the agent's uid connects at the socket and sees
    tsh's prompt."""
    facts = terminal_in_a_fresh_run(terminal_host, 0o077, people.outsider)
    assert facts["modes"]["run_dir"] == 0o711, facts
    assert "coder$ " in facts["at_socket"].get("data", ""), facts
    assert facts["modes"]["base"] & 0o011 == 0o011, oct(facts["modes"]["base"])


def test_a_terminal_started_under_umask_077_is_reached_through_the_sessions_link(
    terminal_host: CoderHost, people: People
) -> None:
    """A-2 (the socket is ``home/<uid>/agent/<agent>/session/<session>/terminal/main.sock``;
    the agent's uid may watch) and docs/sessions.md (a home session's directories 0700, the
    agent's): with ``/run/cortexfs`` as a start under the default umask left it, root starts
    the terminal under umask 077; the agent's uid reaches the socket itself, and through the
    session's ``terminal/main.sock`` as it does under umask 022."""
    facts = terminal_in_a_fresh_run(terminal_host, 0o077, people.outsider, premade=True)
    assert "coder$ " in facts["at_socket"].get("data", ""), facts  # the socket is reached
    assert facts["modes"]["terminal"] & 0o011 == 0o011, oct(facts["modes"]["terminal"])
    assert "coder$ " in facts["at_link"].get("data", ""), facts
