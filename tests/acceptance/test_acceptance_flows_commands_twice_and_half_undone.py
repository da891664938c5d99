"""Flows of every state-changing command run twice in a row, and run again after a person
removed by hand one piece of what its first run made (SPEC §1 R-5, §2 Q-1..Q-6 and I-5, §2.4
exit statuses, §4 S-1 and S-5, §5 P-1, P-5, P-6, §6 T-1, T-7, T-8, §7 H-4, §8 A-3, §9 X-1).

Run twice: ``ctx bootstrap``, ``ctx shared create``, ``ctx queue init``, ``ctx agent create``,
``ctx object install``, ``ctx queue publish`` of one name, ``ctx queue finish``, ``renew``
after ``finish``, ``ctx queue recover`` (plain and ``--reconcile``), ``ctx session repair``,
policy lines appended twice, ``ctx tool tsh.config K=V``.  The second run is either idempotent
(exit 0, nothing rewritten, it says there was nothing to do) or refused with a clear
``EEXIST``/``ENOENT`` and exit 1, with nothing changed on disk.

Then one piece is removed by hand: a control file of a tool, ``agent/<name>.d/label``, the
agent's entry, ``queue/config`` or a queue directory, a tier directory, a session's
``events.jsonl``, ``lease/J/worker``, one half of a terminal pair, ``tool/tsh.d/config``.
The same command, or ``ctx bootstrap``, either puts the piece back and names it, keeping what
the administrator had changed around it, or refuses naming the piece and what to do; never a
half-made object, never lost work, exit statuses as SPEC §2.4 and each command's help say."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root
from tests.support.users import find_or_create_user, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

SCRATCH = scratch_top(__file__)
PROJECT = "proj"
AGENT = "coder"
LABEL = "coder_t"
TOOL = "demo.twice"
PROGRAM = "#!/bin/sh\necho ran-demo\n"
QUEUE_DIRS = ("inbox", "pending", "lease", "claimed", "done", "failed")


# --------------------------------------------------------------------------------------------
# helpers


def stats(top: Path) -> dict[str, tuple[int, int, int, int, int]]:
    """Inode, mtime, mode, uid and gid of every entry under ``top``: what a run that rewrote
    nothing leaves as it was."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            rel = os.path.relpath(os.path.join(dirpath, name), top)
            found[rel] = (st.st_ino, st.st_mtime_ns, st.st_mode, st.st_uid, st.st_gid)
    return found


def without_origins(tree: dict[str, tuple]) -> dict[str, tuple]:
    """A snapshot without the ``origin`` controls, which record when a tool was installed,
    and the empty ``.install-lock`` files that installs and bootstrap take in a tier."""
    return {k: v for k, v in tree.items() if os.path.basename(k) not in ("origin", ".install-lock")}


def under(key: str, piece: str) -> bool:
    return key == piece or key.startswith(piece + "/")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def errno_of(r: Run) -> str:
    """The ``E…`` word of the ``ctx: EXXX: …`` line of a refusal."""
    for line in r.err.splitlines():
        if line.startswith("ctx: E"):
            return line.split(":")[1].strip()
    return ""


@dataclass
class World(OnStorage):
    """A bootstrapped root every uid may search, queue ``proj``, tool ``demo.twice`` in the
    system tier, and agent ``coder`` (uid nobody) allowed ``fs.read`` and ``demo.twice`` in
    both layers of P-6."""

    storage: Path
    top: Path

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, PROJECT)

    @property
    def manifest(self) -> Path:
        return self.top / "src" / f"{TOOL}.json"

    def run_tool(self, tool: str = TOOL, *argv: str) -> Run:
        return self.ctx("run", "--agent", AGENT, tool, *argv)

    def bootstrap(self) -> tuple[Run, dict]:
        r = self.ctx("bootstrap", "--json")
        return r, (r.json() if r.out.strip() else {})

    def events(self) -> Path:
        return self.storage / "home" / "65534" / "agent" / AGENT / "session" / "default"


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    top = new_scratch_dir(SCRATCH, "template-")
    root = top / "storage"
    env = clean_env(CTX_STORAGE=str(root))
    assert ctx_run("bootstrap", env=env).rc == 0
    assert ctx_run("queue", "init", "--project", PROJECT, env=env).rc == 0
    manifest = tool_manifest(top / "src", TOOL, PROGRAM)
    (top / "src" / f"{TOOL}.sh").chmod(0o755)
    r = ctx_run("object", "install", "--tier", "system", manifest, env=env)
    assert r.rc == 0, r
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w-")
    shutil.copytree(template / "src", top / "src")
    copy_of_root(template / "storage", top / "storage")
    made = World(top / "storage", top)
    # Made here, not copied: an agent's mount names the root it was created for.
    made.create_agent({"name": AGENT, "label": LABEL, "tools": ["fs.read", TOOL]})
    made.allow_tool(LABEL, "fs.read", TOOL)
    yield made
    shutil.rmtree(top, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# bootstrap


def test_bootstrap_run_twice_rewrites_nothing_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    first = ctx_run("bootstrap", "--storage", root, "--json")
    assert first.rc == 0 and first.json()["created"], first
    before, stamps = snapshot(root), stats(root)
    second = ctx_run("bootstrap", "--storage", root, "--json")
    assert second.rc == 0, second
    assert {k: second.json()[k] for k in ("created", "repaired", "problems", "warnings")} == {
        "created": [],
        "repaired": [],
        "problems": [],
        "warnings": [],
    }
    third = ctx_run("bootstrap", "--storage", root)
    assert third.rc == 0 and "nothing to do" in third.out, third
    assert snapshot(root) == before
    assert stats(root) == stamps  # not one entry rewritten, renamed or touched


BOOTSTRAP_PIECES = [
    "tool/fs.read.d/schema",
    "tool/fs.read.d/policy",
    "tool/fs.read.d/hooks/pre.d",
    "tool/fs.read.d",
    "tool/fs.read",
    "tool/tsh.d/config",
    "tool/tsh.d",
    "bin/ctxterm",
    "shared/cortexfs-docs/man/ctx.agent.md",
    "tool",
]


@pytest.mark.parametrize("piece", BOOTSTRAP_PIECES)
def test_bootstrap_puts_back_a_piece_removed_by_hand_and_keeps_the_rest(
    world: World, template: Path, piece: str
) -> None:
    # As bootstrap makes it: the core tools without the grants this world added, and
    # without the administrator's own tool, which no bootstrap puts back.
    pristine = {
        k: v
        for k, v in snapshot(template / "storage").items()
        if not under(k, f"tool/{TOOL}") and not under(k, f"tool/{TOOL}.d")
    }
    pristine["bin/ctxterm"] = snapshot(world.storage)["bin/ctxterm"]  # names its own root
    # What an administrator changed around the piece: a grant, a log line, a hook, settings.
    controls = world.storage / "tool" / "fs.read.d"
    with (controls / "policy").open("a") as policy:
        policy.write("allow other_t tool:fs.read execute\n")
    with (controls / "log").open("a") as log:
        log.write('{"kept": true}\n')
    hook = controls / "hooks" / "post.d" / "50-note"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    r = world.ctx("tool", "tsh.config", "cache_capacity=48")
    assert r.rc == 0, r
    before = snapshot(world.storage)

    remove(world.storage / piece)
    r, report = world.bootstrap()
    assert r.rc == 0, r
    said = report["created"] + report["repaired"]
    assert said, r
    assert any(
        piece == s
        or under(piece, s)
        or piece.startswith(s + ".d/")
        or piece == s + ".d"
        or under(s, piece)
        for s in said
    ), (piece, said)
    assert report["problems"] == [], r

    expected = {k: v for k, v in before.items() if not under(k, piece)}
    expected.update({k: v for k, v in pristine.items() if under(k, piece)})
    assert without_origins(snapshot(world.storage)) == without_origins(expected)

    again, report = world.bootstrap()
    assert again.rc == 0 and report["created"] == report["repaired"] == [], again
    if f"allow {LABEL}" not in (controls / "policy").read_text():
        world.allow_tool(LABEL, "fs.read")  # a grant removed with the piece is not guessed
    ran = world.run_tool("fs.read", json.dumps({"path": "/ctx/tool/fs.read.d/name"}))
    assert ran.rc == 0 and ran.out.strip() == "fs.read", ran


# --------------------------------------------------------------------------------------------
# tsh.config K=V


def test_tsh_config_set_twice_then_with_its_file_or_directory_removed(world: World) -> None:
    config = world.storage / "tool" / "tsh.d" / "config"
    first = world.ctx("tool", "--json", "tsh.config", "window_percent=2")
    assert first.rc == 0 and first.json()["changed"] == ["window_percent"], first
    stamp = stats(config.parent)["config"]
    second = world.ctx("tool", "--json", "tsh.config", "window_percent=2")
    assert second.rc == 0 and second.json()["changed"] == [], second
    assert second.json()["config"]["window_percent"] == 2
    assert stats(config.parent)["config"] == stamp  # not rewritten

    config.unlink()
    read = world.ctx("tool", "tsh.config")
    assert read.rc == 0 and "does not exist" in read.err and "bootstrap" in read.err, read
    assert not config.exists()  # reading makes nothing
    made = world.ctx("tool", "--json", "tsh.config", "cache_capacity=40")
    assert made.rc == 0 and made.json()["changed"] == ["cache_capacity"], made
    assert made.json()["config"] == {
        "max_loaded_tools": 64,
        "cache_capacity": 40,
        "window_percent": 1,
    }
    assert "cache_capacity=40" in config.read_text()

    shutil.rmtree(config.parent)
    refused = world.ctx("tool", "tsh.config", "cache_capacity=41")
    assert refused.rc == 1 and errno_of(refused) == "ENOENT", refused
    assert "tsh.d" in refused.err and "bootstrap" in refused.err, refused
    assert not config.parent.exists()  # no half-made control directory
    r, report = world.bootstrap()
    assert r.rc == 0 and "tool/tsh.d/config" in report["created"], r
    after = world.ctx("tool", "--json", "tsh.config", "cache_capacity=41")
    assert after.rc == 0 and after.json()["changed"] == ["cache_capacity"], after


def test_the_owner_of_a_root_gets_a_removed_tsh_config_back_from_roots_bootstrap() -> None:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "owner-")
    try:
        os.chown(top, user.uid, user.gid)
        root = top / "storage"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(top)}

        def as_owner(*args: str) -> subprocess.CompletedProcess[str]:
            argv = [*CTX_ARGV, "--storage", str(root), *args]
            return run_as(user, argv, env=env)

        assert as_owner("bootstrap").returncode == 0
        for changed in (["cache_capacity"], []):
            done = as_owner("tool", "--json", "tsh.config", "cache_capacity=50")
            assert done.returncode == 0, done
            assert json.loads(done.stdout)["changed"] == changed, done
        (root / "tool" / "tsh.d" / "config").unlink()
        r = ctx_run("bootstrap", "--storage", root, "--json")
        assert r.rc == 0 and "tool/tsh.d/config" in r.json()["created"], r
        assert (root / "tool" / "tsh.d" / "config").stat().st_uid == user.uid
        done = as_owner("tool", "--json", "tsh.config", "cache_capacity=51")
        assert done.returncode == 0, done
        assert json.loads(done.stdout)["changed"] == ["cache_capacity"]
        again = as_owner("bootstrap", "--json")
        assert again.returncode == 0, again
        assert json.loads(again.stdout)["created"] == [], again
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# shared spaces and queue init


def test_shared_create_and_queue_init_twice_change_nothing(world: World) -> None:
    space = world.storage / "shared" / "twice"
    first = world.ctx("shared", "create", "twice", "--json")
    assert first.rc == 0 and first.json()["created"], first
    before, stamps = snapshot(space), stats(space)
    for argv in (
        ("shared", "create", "twice", "--json"),
        ("queue", "init", "--project", "twice", "--json"),
        ("shared", "create", "twice", "--json"),
    ):
        r = world.ctx(*argv)
        assert r.rc == 0 and r.json()["created"] == [], r
    text = world.ctx("shared", "create", "twice")
    assert text.rc == 0 and "nothing to do" in text.out, text
    assert snapshot(space) == before and stats(space) == stamps


SPACE_PIECES = ["queue/config", "queue/pending", "queue/lease", "data", "tool"]


@pytest.mark.parametrize("command", ["queue-init", "shared-create"])
@pytest.mark.parametrize("piece", SPACE_PIECES)
def test_a_piece_of_a_space_removed_by_hand_is_made_again_and_named(
    world: World, piece: str, command: str
) -> None:
    space = world.storage / "shared" / PROJECT
    config = space / "queue" / "config"
    config.write_text(
        config.read_text().replace("max_request_bytes=1048576", "max_request_bytes=4096")
    )
    job = world.queue.publish(request(), name="kept")
    (space / "data" / "notes.txt").write_text("mine\n")
    mode = (space / piece).stat()
    before = snapshot(space)
    remove(space / piece)

    argv = (
        ("queue", "init", "--project", PROJECT, "--json")
        if command == "queue-init"
        else ("shared", "create", PROJECT, "--json")
    )
    r = world.ctx(*argv)
    assert r.rc == 0, r
    assert r.json()["created"] == [str(space / piece)], r
    made = (space / piece).stat()
    assert (made.st_mode, made.st_uid, made.st_gid) == (mode.st_mode, mode.st_uid, mode.st_gid)
    after = snapshot(space)
    for key, value in before.items():  # everything that was not removed is as it was
        if not under(key, piece):
            assert after.get(key) == value, key
    if piece != "queue/config":
        assert "max_request_bytes=4096" in config.read_text()
    if piece != "queue/pending":
        assert world.queue.state(job) == "pending"
    again = world.ctx(*argv)
    assert again.rc == 0 and again.json()["created"] == [], again


@pytest.mark.parametrize("sub", QUEUE_DIRS)
def test_queue_commands_refuse_a_queue_missing_a_directory_and_change_nothing(
    world: World, sub: str
) -> None:
    q = world.queue
    q.publish(request(), name="waiting")
    shutil.rmtree(q.dir / sub)
    before = snapshot(world.storage / "shared")
    for args, stdin in (
        (("publish", "--name", "other", "-"), json.dumps(request())),
        (("claim", "--pid", str(os.getpid())), None),
        (("status",), None),
        (("recover",), None),
        (("recover", "--reconcile"), None),
    ):
        r = q.run(args[0], *args[1:], input=stdin)
        assert r.rc == 1 and errno_of(r) == "ENOENT", r
        assert f"no {sub}/ directory" in r.err and "ctx queue init" in r.err, r
        assert r.out == "" and "Traceback" not in r.err, r
    assert snapshot(world.storage / "shared") == before
    fixed = q.run("init", "--json")
    assert fixed.rc == 0 and fixed.json()["created"] == [str(q.dir / sub)], fixed
    assert q.run("recover").rc == 0


# --------------------------------------------------------------------------------------------
# publish, finish, renew and recover twice


@pytest.mark.parametrize("state", ["pending", "claimed", "done", "failed"])
def test_publishing_one_name_twice_is_eexist_in_each_state_with_nothing_changed(
    world: World, state: str
) -> None:
    q = world.queue
    job = q.publish(request(n=1), name="once")
    holder = subprocess.Popen(["sleep", "60"])
    try:
        if state != "pending":
            assert q.claim("--pid", str(holder.pid)) == job
        if state in ("done", "failed"):
            q.finish(job, "--ok" if state == "done" else "--error")
        before = snapshot(q.dir)
        for name in ("once", job):
            r = q.run("publish", "--name", name, "-", input=json.dumps(request(n=2)))
            assert r.rc == 1 and errno_of(r) == "EEXIST", r
            assert r.out == "" and state in r.err, r
        assert snapshot(q.dir) == before
        assert q.state(job) == state and q.entries("inbox") == set()
    finally:
        holder.kill()
        holder.wait()


def test_finish_twice_and_renew_after_finish_are_refused_with_the_result_kept(
    world: World,
) -> None:
    q = world.queue
    holder = subprocess.Popen(["sleep", "60"])
    try:
        job = q.publish(request(), name="fin")
        assert q.claim("--pid", str(holder.pid)) == job
        q.finish(job, "--ok", {"first": True})
        before = snapshot(q.dir)
        for flag in ("--ok", "--error"):
            r = q.run("finish", job, flag, "-", input='{"second": true}')
            assert r.rc == 1 and errno_of(r) == "EEXIST", r
            assert "already done" in r.err, r
        r = q.run("renew", job, "--pid", str(holder.pid))
        assert r.rc == 1 and errno_of(r) == "ENOENT" and "already done" in r.err, r
        assert snapshot(q.dir) == before
        state, result = q.only_result(job)
        assert state == "done" and result["output"] == {"first": True}
        q.assert_settled()
    finally:
        holder.kill()
        holder.wait()


def test_recover_twice_after_a_holder_died_requeues_once_then_changes_nothing(
    world: World,
) -> None:
    q = world.queue
    job = q.publish(request(), name="orphan")
    holder = subprocess.Popen(["sleep", "60"])
    assert q.claim("--pid", str(holder.pid)) == job
    holder.kill()
    holder.wait()
    first = q.run("recover", "--json")
    assert first.rc == 0 and [i["job"] for i in first.json()["requeued"]] == [job], first
    before, stamps = snapshot(q.dir), stats(q.dir)
    for args in ((), (), ("--reconcile",), ("--reconcile",)):
        r = q.run("recover", "--json", *args)
        assert r.rc == 0 and r.json()["consistent"] is True, r
        assert r.json()["requeued"] == [] and r.json()["repaired"] == [], r
    assert snapshot(q.dir) == before and stats(q.dir) == stamps
    assert q.state(job) == "pending"


def test_a_lease_file_removed_by_hand_is_named_then_reconciled_once(world: World) -> None:
    q = world.queue
    holder = subprocess.Popen(["sleep", "60"])
    try:
        job = q.publish(request(), name="unleased")
        assert q.claim("--pid", str(holder.pid)) == job
        (q.dir / "lease" / job / "worker").unlink()
        before = snapshot(q.dir)
        finish = q.run("finish", job, "--ok", "-", input="{}")
        renew = q.run("renew", job, "--pid", str(holder.pid))
        for r in (finish, renew):
            assert r.rc == 1 and errno_of(r) == "ENOENT", r
            assert f"lease/{job}/worker" in r.err and "--reconcile" in r.err, r
        for _ in range(2):
            plain = q.run("recover", "--json")
            assert plain.rc == 1 and plain.json()["consistent"] is False, plain
            assert [i["job"] for i in plain.json()["incomplete"]] == [job], plain
        assert snapshot(q.dir) == before  # refused and reported: nothing moved
        fixed = q.run("recover", "--reconcile", "--json")
        assert fixed.rc == 0 and [i["job"] for i in fixed.json()["repaired"]] == [job], fixed
        assert q.state(job) == "pending"
        assert q.entries("lease") == set() and q.entries("claimed") == set()
        settled = snapshot(q.dir)
        again = q.run("recover", "--reconcile", "--json")
        assert again.rc == 0 and again.json()["repaired"] == [], again
        assert snapshot(q.dir) == settled
        late = q.run("finish", job, "--ok", "-", input="{}")
        assert late.rc == 1 and errno_of(late) == "ENOENT" and "pending" in late.err, late
        assert q.claim("--pid", str(holder.pid)) == job
        q.finish(job)
        assert q.only_result(job)[0] == "done"
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("half", ["result", "request"])
def test_one_half_of_a_terminal_pair_removed_by_hand_is_a_conflict_nothing_overwrites(
    world: World, half: str
) -> None:
    q = world.queue
    job = q.publish(request(), name="halved")
    assert q.claim("--pid", str(os.getpid())) == job
    q.finish(job, "--ok", {"kept": 1})
    removed = q.dir / "done" / (f"{job}.result" if half == "result" else job)
    removed.unlink()
    before = snapshot(q.dir)
    for args, stdin in (
        (("finish", job, "--ok", "-"), '{"again": 2}'),
        (("finish", job, "--error", "-"), '{"again": 2}'),
        (("publish", "--name", job, "-"), json.dumps(request())),
    ):
        r = q.run(*args, input=stdin)
        assert r.rc == 1 and r.out == "", r
    for args in ((), ("--reconcile",), ()):
        r = q.run("recover", "--json", *args)
        assert r.rc == 1 and [c["job"] for c in r.json()["conflicts"]] == [job], r
    assert snapshot(q.dir) == before
    assert not removed.exists()


def test_finish_again_of_a_job_whose_request_was_removed_names_its_result(world: World) -> None:
    q = world.queue
    job = q.publish(request(), name="resultonly")
    assert q.claim("--pid", str(os.getpid())) == job
    q.finish(job, "--ok")
    (q.dir / "done" / job).unlink()
    published = q.run("publish", "--name", job, "-", input=json.dumps(request()))
    assert published.rc == 1 and errno_of(published) == "EEXIST", published
    # As for a whole pair: finish is EEXIST, renew ENOENT (there is no lease to renew).
    for r, code in (
        (q.run("finish", job, "--ok", "-", input="{}"), "EEXIST"),
        (q.run("renew", job, "--pid", str(os.getpid())), "ENOENT"),
    ):
        assert r.rc == 1, r
        assert "no such job" not in r.err, r
        assert errno_of(r) == code and "done" in r.err, r
        assert f"done/{job}.result" in r.err and f"done/{job} is missing" in r.err, r


def test_finish_again_of_a_job_whose_result_was_removed_says_the_result_is_missing(
    world: World,
) -> None:
    """Q-6: half a terminal pair is a conflict: a second finish is refused, saying which half
    is left and which is missing (not that 'ctx queue show' shows a result there is not)."""
    q = world.queue
    job = q.publish(request(), name="requestonly")
    assert q.claim("--pid", str(os.getpid())) == job
    q.finish(job, "--ok")
    (q.dir / "done" / f"{job}.result").unlink()
    before = snapshot(q.dir)
    r = q.run("finish", job, "--ok", "-", input="{}")
    assert r.rc == 1 and errno_of(r) == "EEXIST", r
    assert f"done/{job}.result is missing" in r.err and "shows its result" not in r.err, r
    assert snapshot(q.dir) == before


# --------------------------------------------------------------------------------------------
# agents and their policies


def test_agent_create_twice_then_with_its_label_or_entry_removed(world: World) -> None:
    agents = world.storage / "agent"
    req = json.dumps({"name": AGENT, "label": LABEL, "tools": ["fs.read"]})
    before = snapshot(agents)
    again = world.ctx("agent", "create", "-", input=req)
    assert again.rc == 1 and errno_of(again) == "EEXIST" and "never overwritten" in again.err
    assert snapshot(agents) == before

    (agents / f"{AGENT}.d" / "label").unlink()
    before = snapshot(agents)
    again = world.ctx("agent", "create", "-", input=req)
    assert again.rc == 1 and errno_of(again) == "EEXIST", again
    assert snapshot(agents) == before  # nothing put back, nothing half-changed
    shown = world.ctx("agent", "show", AGENT, "--json")
    assert shown.rc == 0 and any("label" in p for p in shown.json()["problems"]), shown
    listed = world.ctx("agent", "list", "--json")
    assert listed.rc == 0, listed
    [entry] = [a for a in listed.json() if a["name"] == AGENT]
    assert any(f"agent/{AGENT}.d/label" in p for p in entry["problems"]), entry
    ran = world.run_tool("fs.read", json.dumps({"path": "/ctx/tool/fs.read.d/name"}))
    assert ran.rc == 126 and "step 4" in ran.err and "label" in ran.err, ran
    assert ran.out == ""
    boot, _ = world.bootstrap()
    assert boot.rc == 0, boot
    assert not (agents / f"{AGENT}.d" / "label").exists()

    (agents / AGENT).unlink()
    before = snapshot(agents)
    again = world.ctx("agent", "create", "-", input=req)
    assert again.rc == 1 and errno_of(again) == "EEXIST", again
    assert f"agent/{AGENT}.d" in again.err and "nothing was created" in again.err, again
    assert snapshot(agents) == before
    missing = world.ctx("agent", "show", AGENT)
    assert missing.rc == 1 and errno_of(missing) == "ENOENT", missing


def test_policy_lines_appended_twice_then_the_policy_removed(world: World) -> None:
    policy = world.storage / "agent" / f"{AGENT}.d" / "policy"
    line = f"allow {LABEL} tool:fs.read execute\n"
    for _ in range(2):
        with policy.open("a") as f:
            f.write(line)
    checked = world.ctx("policy", "check", policy)
    assert checked.rc == 0 and checked.err == "", checked
    argv = ("fs.read", json.dumps({"path": "/ctx/tool/fs.read.d/name"}))
    assert world.run_tool(*argv).rc == 0

    policy.unlink()
    ran = world.run_tool(*argv)
    assert ran.rc == 126 and ran.out == "", ran
    assert "step 5" in ran.err and f"agent/{AGENT}.d/policy" in ran.err, ran
    explained = world.ctx("policy", "explain", AGENT, "tool:fs.read", "execute", "--json")
    assert explained.rc == 1 and explained.json()["step"] == 5, explained
    assert not policy.exists()  # a refusal recreates no grant

    tool_policy = world.storage / "tool" / "fs.read.d" / "policy"
    tool_policy.unlink()
    boot, report = world.bootstrap()
    assert boot.rc == 0 and "tool/fs.read" in report["repaired"], boot
    assert f"allow {LABEL}" not in tool_policy.read_text()  # default deny, no grant guessed


# --------------------------------------------------------------------------------------------
# installed tools


def test_an_install_run_twice_keeps_the_administrators_controls(world: World) -> None:
    controls = world.storage / "tool" / f"{TOOL}.d"
    (controls / "status").write_text("disabled\n")
    with (controls / "log").open("a") as log:
        log.write('{"kept": true}\n')
    hook = controls / "hooks" / "pre.d" / "10-mine"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    before = snapshot(controls)
    for _ in range(2):
        r = world.ctx("object", "install", "--tier", "system", world.manifest, "--json")
        assert r.rc == 0 and r.json()["replaced"] is True, r
    assert without_origins(snapshot(controls)) == without_origins(before)


TOOL_CONTROLS = ["schema", "log", "hooks/pre.d", "policy"]


@pytest.mark.parametrize("control", TOOL_CONTROLS)
def test_a_control_of_an_installed_tool_removed_by_hand_is_named_until_reinstalled(
    world: World, control: str
) -> None:
    assert world.run_tool().out == "ran-demo\n"
    controls = world.storage / "tool" / f"{TOOL}.d"
    remove(controls / control)
    shown = f"{TOOL}.d/{control}"

    ran = world.run_tool()
    assert ran.rc == 126 and "ran-demo" not in ran.out, ran
    assert shown in ran.err, ran
    listed = world.ctx("object", "list", "--json")
    [entry] = [t for t in listed.json() if t["name"] == TOOL and t["tier"] == "system"]
    assert entry["status"] == "damaged", entry

    before = snapshot(world.storage)
    boot, report = world.bootstrap()
    assert boot.rc == 0, boot
    assert any(shown in w for w in report["warnings"]), report
    assert any("object install" in w for w in report["warnings"]), report
    # bootstrap repairs only the core tools
    assert without_origins(snapshot(world.storage)) == without_origins(before)

    r = world.ctx("object", "install", "--tier", "system", world.manifest, "--json")
    assert r.rc == 0, r
    assert (controls / control).exists()
    if control == "policy":  # a grant removed is not guessed back
        assert world.run_tool().rc == 126
        world.allow_tool(LABEL, TOOL)
    assert world.run_tool().out == "ran-demo\n"
    again, report = world.bootstrap()
    assert again.rc == 0 and report["warnings"] == [], again


def test_tier_directories_removed_by_hand(world: World) -> None:
    user_tier = world.storage / "home" / "0" / "tool"
    r = world.ctx("object", "install", "--tier", "user", world.manifest, "--json")
    assert r.rc == 0 and r.json()["replaced"] is False, r
    r = world.ctx("object", "install", "--tier", "user", world.manifest, "--json")
    assert r.rc == 0 and r.json()["replaced"] is True, r
    shutil.rmtree(user_tier)
    r = world.ctx("object", "install", "--tier", "user", world.manifest, "--json")
    assert r.rc == 0 and (user_tier / TOOL).is_file(), r

    space_tier = world.storage / "shared" / PROJECT / "tool"
    shutil.rmtree(space_tier)
    before = snapshot(world.storage)
    r = world.ctx("object", "install", "--tier", f"shared:{PROJECT}", world.manifest)
    assert r.rc == 1 and errno_of(r) == "ENOENT", r
    assert f"ctx shared create {PROJECT}" in r.err, r
    assert snapshot(world.storage) == before
    made = world.ctx("shared", "create", PROJECT, "--json")
    assert made.rc == 0 and made.json()["created"] == [str(space_tier)], made
    r = world.ctx("object", "install", "--tier", f"shared:{PROJECT}", world.manifest)
    assert r.rc == 0 and (space_tier / TOOL).is_file(), r

    shutil.rmtree(world.storage / "tool")
    before = snapshot(world.storage)
    r = world.ctx("object", "install", "--tier", "system", world.manifest)
    assert r.rc == 1 and errno_of(r) == "ENOENT" and "ctx bootstrap" in r.err, r
    assert snapshot(world.storage) == before


# --------------------------------------------------------------------------------------------
# sessions


def test_session_repair_twice_then_with_events_jsonl_removed(world: World) -> None:
    argv = ("fs.read", json.dumps({"path": "/ctx/tool/fs.read.d/name"}))
    assert world.run_tool(*argv).rc == 0
    events = world.events() / "events.jsonl"
    whole = events.read_bytes()
    with events.open("ab") as f:
        f.write(b'{"ts": "2026-06-22T12:00:00Z", "type": "tool')
    first = world.ctx("session", "repair", AGENT, "--json")
    assert first.rc == 0 and first.json()["truncated_bytes"] > 0, first
    assert events.read_bytes() == whole
    stamp = stats(world.events())
    second = world.ctx("session", "repair", AGENT, "--json")
    assert second.rc == 0 and second.json()["truncated_bytes"] == 0, second
    assert stats(world.events()) == stamp

    events.unlink()
    for _ in range(2):
        r = world.ctx("session", "repair", AGENT)
        assert r.rc == 1 and errno_of(r) == "ENOENT" and "events.jsonl" in r.err, r
        assert not events.exists()  # a repair makes no history up
    assert world.run_tool(*argv).rc == 0
    st = events.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o600)
    assert [e["type"] for e in read_jsonl(events)] == ["tool_call", "tool_result"]
    done = world.ctx("session", "repair", AGENT, "--json")
    assert done.rc == 0 and done.json()["truncated_bytes"] == 0, done
