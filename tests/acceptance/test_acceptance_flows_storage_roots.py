"""Where the storage root is (SPEC §1 R-1..R-5), as real users meet it: ``--storage`` and
``CTX_STORAGE`` given as relative paths, the XDG default of an ordinary user below a path with
spaces and non-ASCII characters, a root reached through ``storage/current -> release``, a root
that is missing, a file, another user's, on a read-only bind mount or ``chmod a-w``, and two
roots used side by side.  Every command runs as a real process; each refusal must name the path
and what to do, and leave the tree as it was."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_run,
    request,
    scratch_top,
    snapshot,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

CTX = CTX_ARGV[0]
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
SYSTEM_ROOT = "/var/lib/cortexfs/storage/current"
CORE_TOOLS = {"fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config"}
JOB = json.dumps(request("fs.stat", input={"path": "/ctx"}))
MANIFEST = {
    "manifest": 2,
    "kind": "tool",
    "name": "hello.say",
    "description": "say hello",
    "schema": {"type": "object"},
    "cap": {"side_effects": False, "network": False},
    "exec": "/bin/echo",
}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts, other uids)")


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory every uid may search (agents run as ``nobody``, the test user as
    itself), below /tmp/<this file's stem>-<uid>/."""
    top = scratch_top(__file__)
    top.mkdir(mode=0o755, exist_ok=True)
    top.chmod(0o755)
    path = Path(tempfile.mkdtemp(dir=top))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def on(root: Path | str, *args, **kw) -> Run:
    """``ctx --storage ROOT ARGS`` with no CTX_ setting in the environment."""
    return ctx_run("--storage", root, *args, **kw)


def stat_agent(root: Path, name: str = "ci") -> None:
    """Agent ``name`` (runs as nobody) allowed ``fs.stat`` in both layers of P-6."""
    req = {"name": name, "label": f"{name}_t", "tools": ["fs.stat"]}
    made = on(root, "agent", "create", "-", input=json.dumps(req))
    assert made.rc == 0, made
    with open(root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write(f"allow {name}_t tool:fs.stat execute\n")


def native_stat(root: Path | str, agent: str = "ci", path: str = "/ctx/tool") -> tuple[Run, dict]:
    """``ctx run --agent AGENT --native fs.stat`` and its last (result) frame."""
    ran = on(root, "run", "--agent", agent, "--native", "fs.stat", input=json.dumps({"path": path}))
    frames = [json.loads(line) for line in ran.lines()]
    assert frames and frames[-1]["type"] == "result", ran
    return ran, frames[-1]


def refused(run: Run, rc: int, errno_name: str, *named: str) -> str:
    """``run`` failed with ``rc`` and one ``ctx: ERRNO: ...`` line naming each of ``named``."""
    assert run.rc == rc, run
    assert "Traceback" not in run.err, run
    errors = [line for line in run.err.splitlines() if line.startswith("ctx: ")]
    errors = [line for line in errors if not line.startswith("ctx: warning:")]
    assert len(errors) == 1, run
    assert errors[0].startswith(f"ctx: {errno_name}: "), run
    for text in named:
        assert text in errors[0], (text, run)
    return errors[0]


def as_user(
    user: UnprivilegedUser, env: dict[str, str], *args: str, stdin: str = "", cwd: Path
) -> Run:
    done = run_as(user, [CTX, *args], env=env, cwd=cwd, stdin=stdin)
    return Run(list(args), done.returncode, done.stdout, done.stderr)


@contextlib.contextmanager
def read_only_bind(source: Path, target: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``target`` for the block; skipped where the kernel
    or the container refuses the mount."""
    target.mkdir()
    bound = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        ro = ["mount", "-o", "remount,bind,ro", str(target)]
        if subprocess.run(ro, capture_output=True).returncode != 0:
            pytest.skip("cannot remount a bind mount read-only here")
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


# ------------------------------------------------------------------------------ the tests


def test_relative_storage_and_ctx_storage_name_roots_below_the_current_directory(
    place: Path,
) -> None:
    """R-1: ``--storage DIR`` and ``CTX_STORAGE`` may be relative: both are read against the
    directory ctx was started in, and everything the root records (queue paths, ctxterm's
    default root, an agent's /ctx mount) holds the absolute path, so the root still works from
    anywhere else; from another directory the same relative name is another (missing) root,
    reported by its absolute path with the command that makes it."""
    work, elsewhere = place / "site", place / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()

    by_option = ctx_run(
        "--storage", "opt-root", "queue", "init", "--project", "p", "--json", cwd=work
    )
    assert by_option.rc == 0, by_option
    assert by_option.json()["queue"] == str(work / "opt-root/shared/p/queue")
    env = clean_env(CTX_STORAGE="env-root")
    by_env = ctx_run("queue", "init", "--project", "p", "--json", env=env, cwd=work)
    assert by_env.rc == 0, by_env
    assert by_env.json()["queue"] == str(work / "env-root/shared/p/queue")
    published = ctx_run(
        "queue", "publish", "--project", "p", "--name", "j", "-", input=JOB, env=env, cwd=work
    )
    assert (published.rc, published.out) == (0, "j.req.json\n"), published
    for root in (work / "opt-root", work / "env-root"):
        assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
        assert {p.name for p in (root / "tool").iterdir()} >= CORE_TOOLS
        assert f"storage='{root}'" in (root / "bin" / "ctxterm").read_text()
    made = ctx_run(
        "agent", "create", "--storage", "opt-root", "-", cwd=work,
        input=json.dumps({"name": "ci", "label": "ci_t", "tools": ["fs.stat"]}),
    )  # fmt: skip
    assert made.rc == 0, made
    mounts = json.loads((work / "opt-root/agent/ci.d/mount").read_text())
    assert [str(work / "opt-root"), "/ctx", "ro"] in mounts, mounts

    # The same root, named relatively from another directory, and absolutely from anywhere.
    relative = ["--storage", "../site/env-root"]
    status = ctx_run("queue", "status", "--project", "p", "--json", *relative, cwd=elsewhere)
    assert status.rc == 0 and status.json()["counts"]["pending"] == 1, status
    shown = Path(status.json()["queue"])
    assert shown.is_absolute() and shown.resolve() == work / "env-root/shared/p/queue", status
    listed = on(work / "opt-root", "agent", "list", cwd=Path("/"))
    assert listed.rc == 0 and listed.out.startswith("ci "), listed

    # The relative name from elsewhere is a root that does not exist: named, nothing made.
    missing = ctx_run("queue", "status", "--project", "p", env=env, cwd=elsewhere)
    refused(missing, 1, "ENOENT", str(elsewhere / "env-root/shared/p/queue"), "ctx queue init")
    assert list(elsewhere.iterdir()) == []


def test_a_missing_root_is_made_whole_by_init_and_refused_by_everything_else(place: Path) -> None:
    """R-1/R-5 and the queue docs: on a root that does not exist, reading and queue commands
    refuse with ENOENT naming the missing path and the command that makes it ('ctx queue
    init' for a queue, 'ctx bootstrap' for the root) and create nothing; ``queue init`` and
    ``shared create`` make the root whole first, as bootstrap does, parents included."""
    root = place / "not yet" / "deeper" / "storage"
    queue_path = root / "shared/p/queue"
    for args in (
        ["queue", "status", "--project", "p"],
        ["queue", "publish", "--project", "p", "-"],
        ["queue", "claim", "--project", "p"],
    ):
        refused(
            on(root, *args, input=JOB), 1, "ENOENT", f"no queue at {queue_path}", "ctx queue init"
        )
    for args in (["object", "list"], ["agent", "list"], ["session", "show", "ci"]):
        ran = on(root, *args)
        refused(ran, 1, "ENOENT", f"storage root {root} does not exist", "ctx bootstrap")
    which = on(root, "object", "which", "fs.read")
    refused(which, 1, "ENOENT", f"ctx bootstrap --storage {shlex.quote(str(root))}")
    assert list(place.iterdir()) == []

    made = on(root, "queue", "init", "--project", "p", "--json")
    assert made.rc == 0, made
    created = made.json()["created"]
    assert str(place / "not yet") in created and str(root) in created, created
    assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
    assert {p.name for p in (root / "tool").iterdir()} >= CORE_TOOLS
    assert (root / "shared/cortexfs-docs/README.md").is_file()
    assert {p.name for p in queue_path.iterdir()} >= QUEUE_SUBDIRS
    ready = on(root, "queue", "status", "--project", "p", "--json")
    assert ready.rc == 0 and ready.json()["counts"]["pending"] == 0, ready

    other = place / "second" / "storage"
    space = on(other, "shared", "create", "s")
    assert space.rc == 0, space
    assert {p.name for p in other.iterdir()} == ROOT_ENTRIES
    assert (other / "shared/s/queue/pending").is_dir()
    assert {p.name for p in (other / "tool").iterdir()} >= CORE_TOOLS


def test_a_file_named_as_the_root_is_refused_by_its_path_and_left_untouched(place: Path) -> None:
    """R-1: a root must be a directory.  ``--storage FILE`` is a usage error (exit 2, EINVAL)
    for every command; ``CTX_STORAGE=FILE`` is ENOTDIR (exit 1) naming the file for the commands
    that would make or open the root; neither writes to the file or next to it."""
    file = place / "storage"
    file.write_text("not a root\n")
    for args in (["bootstrap"], ["queue", "status", "--project", "p"], ["object", "list"]):
        ran = on(file, *args)
        refused(ran, 2, "EINVAL", "--storage", str(file), "is a file")
    env = clean_env(CTX_STORAGE=str(file))
    for args in (
        ["bootstrap"],
        ["queue", "init", "--project", "p"],
        ["queue", "status", "--project", "p"],
        ["queue", "publish", "--project", "p", "-"],
    ):
        ran = ctx_run(*args, env=env, input=JOB)
        refused(ran, 1, "ENOTDIR", str(file))
    assert file.read_text() == "not a root\n"
    assert [p.name for p in place.iterdir()] == ["storage"]


def test_reading_commands_call_a_file_root_not_a_directory_rather_than_missing(
    place: Path,
) -> None:
    """R-1 and the README's 'ctx: ERRNO: what to do': a root path that exists but is a file is
    ENOTDIR for the reading commands too, as for bootstrap and the queue; ENOENT with 'create
    it with ctx bootstrap' sends the user to a command that then refuses."""
    file = place / "storage"
    file.write_text("not a root\n")
    env = clean_env(CTX_STORAGE=str(file))
    assert ctx_run("bootstrap", env=env).err.startswith("ctx: ENOTDIR: ")
    for args in (["object", "list"], ["agent", "list"], ["session", "show", "ci"]):
        refused(ctx_run(*args, env=env), 1, "ENOTDIR", str(file))


def test_a_root_reached_through_a_current_link_follows_the_link_for_queue_and_objects(
    place: Path,
) -> None:
    """R-1 and the queue docs ('only the storage root may be reached through a link its
    administrator made, storage/current -> a release'): bootstrap, queue, object, agent and
    policy commands work through the link, record the release's real path in the agent's /ctx
    mount, and after the link is moved to a new release they see only that release."""
    releases = place / "storage"
    releases.mkdir()
    (releases / "rel-1").mkdir()
    current = releases / "current"
    current.symlink_to("rel-1")

    boot = on(current, "bootstrap", "--json")
    assert boot.rc == 0 and boot.json()["problems"] == [], boot
    assert current.is_symlink() and os.readlink(current) == "rel-1"
    assert {p.name for p in (releases / "rel-1").iterdir()} == ROOT_ENTRIES
    assert on(current, "queue", "init", "--project", "p").rc == 0
    job = on(current, "queue", "publish", "--project", "p", "--name", "j", "-", input=JOB)
    assert job.rc == 0, job
    assert (releases / "rel-1/shared/p/queue/pending/j.req.json").is_file()
    stat_agent(current)
    mounts = json.loads((releases / "rel-1/agent/ci.d/mount").read_text())
    assert [str(releases / "rel-1"), "/ctx", "ro"] in mounts, mounts
    explained = on(current, "policy", "explain", "ci", "tool:fs.stat", "execute")
    assert explained.rc == 0 and explained.lines()[-1] == "allow", explained
    listed = on(current, "object", "list")
    assert listed.rc == 0 and "fs.stat" in listed.out, listed

    # An upgrade: a new release, the link moved; the old release stays as it was.
    assert on(releases / "rel-2", "bootstrap").rc == 0
    before = snapshot(releases / "rel-1")
    (releases / "next").symlink_to("rel-2")
    os.replace(releases / "next", current)
    gone = on(current, "queue", "status", "--project", "p")
    refused(gone, 1, "ENOENT", f"no queue at {current}/shared/p/queue", "ctx queue init")
    agents = on(current, "agent", "list")
    assert (agents.rc, agents.out) == (0, ""), agents
    assert on(current, "queue", "init", "--project", "p").rc == 0
    assert (releases / "rel-2/shared/p/queue/pending").is_dir()
    assert snapshot(releases / "rel-1") == before


def test_agents_run_and_record_sessions_through_a_current_link(place: Path) -> None:
    """R-1, S-1, W-1: an agent's call, its session and a worker work through the
    administrator's ``storage/current`` link as through the release's real path."""
    release = place / "rel-1"
    assert on(release, "bootstrap").rc == 0
    assert on(release, "queue", "init", "--project", "p").rc == 0
    stat_agent(release)
    current = place / "current"
    current.symlink_to("rel-1")

    ran, result = native_stat(current)
    assert (ran.rc, result["status"]) == (0, "ok"), ran
    shown = on(current, "session", "show", "ci")
    assert shown.rc == 0 and "tool_result" in shown.out, shown
    job = on(current, "queue", "publish", "--project", "p", "--name", "j", "-", input=JOB)
    assert job.rc == 0, job
    worked = on(current, "queue", "work", "--project", "p", "--drain", "--agent", "ci")
    assert worked.rc == 0, worked
    assert (release / "shared/p/queue/done/j.req.json.result").is_file()


@needs_root
def test_a_root_on_a_read_only_bind_mount_answers_reads_and_refuses_writes_with_erofs(
    place: Path,
) -> None:
    """R-1 with the queue, session and tool docs: on a read-only filesystem queue status/list/
    show, plain recover, object list/which, agent list, session show/list and policy check still
    work; every write (publish, claim, init, shared create, bootstrap, object install, agent
    create, an agent's call, a worker) is refused with EROFS naming the path and 'remount', and
    nothing of it is left in the tree."""
    disk = place / "disk"
    assert on(disk, "queue", "init", "--project", "p").rc == 0
    stat_agent(disk)
    assert native_stat(disk)[1]["status"] == "ok"
    assert on(disk, "queue", "publish", "--project", "p", "--name", "j", "-", input=JOB).rc == 0
    manifest = place / "hello.json"
    manifest.write_text(json.dumps(MANIFEST))
    before = snapshot(disk)

    with read_only_bind(disk, place / "ro") as ro:
        for args in (
            ["queue", "status", "--project", "p"],
            ["queue", "list", "--project", "p"],
            ["queue", "show", "--project", "p", "j"],
            ["queue", "recover", "--project", "p"],
            ["object", "list"],
            ["agent", "list"],
            ["session", "show", "ci"],
            ["policy", "check", str(ro / "tool/fs.stat.d/policy")],
        ):
            assert on(ro, *args).rc == 0, on(ro, *args)
        status = on(ro, "queue", "status", "--project", "p", "--json").json()
        assert status["queue"] == str(ro / "shared/p/queue") and status["counts"]["pending"] == 1
        assert "tool_result" in on(ro, "session", "show", "ci").out

        writes = {
            ("queue", "publish", "--project", "p", "-"): "shared/p/queue/inbox",
            ("queue", "claim", "--project", "p"): "shared/p/queue/claimed",
            ("shared", "create", "s"): "shared",
            ("bootstrap",): "",
            ("object", "install", str(manifest), "--tier", "system"): "tool",
            ("agent", "create", "-"): "agent",
            # The queue is refused before the worker's session is made in home/.
            ("queue", "work", "--project", "p", "--drain", "--agent", "ci"): "shared/p/queue",
        }
        for args, where in writes.items():
            stdin = json.dumps({"name": "x", "label": "x_t"}) if "agent" in args else JOB
            ran = on(ro, *args, input=stdin)
            line = refused(ran, 1, "EROFS", str(ro / where).rstrip("/"))
            assert "remount" in line and "read-write" in line, line
        ran, result = native_stat(ro)
        assert ran.rc == 1 and result["error"]["error"] == "EROFS", ran
        assert str(ro / "home") in result["error"]["message"], result
        assert "remount" in result["error"]["message"], result

    assert snapshot(disk) == before


@needs_root
def test_a_users_default_root_below_spaces_and_non_ascii_then_made_read_only_by_chmod(
    place: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1: with no option an ordinary user's root is $XDG_DATA_HOME/cortexfs/storage/current,
    here below a path with spaces and non-ASCII characters, kept exactly in every output; what
    commands report as the default (root's /var/lib one included, without touching it).  After
    ``chmod -R a-w`` the reads still work and each write is EACCES naming the directory and
    "'chmod u+w' it", with nothing changed; given back its mode the root works again."""
    user = unprivileged_user
    home = place / "hôme dir"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    data_home = home / "dätä ✓ x"
    root = data_home / "cortexfs" / "storage" / "current"
    env = {"PATH": PATH, "HOME": str(home), "XDG_DATA_HOME": str(data_home), "LANG": "C.UTF-8"}

    def ctx(*args: str, stdin: str = "") -> Run:
        return as_user(user, env, *args, stdin=stdin, cwd=home)

    made = ctx("queue", "init", "--project", "p", "--json")
    assert made.rc == 0, made
    assert made.json()["queue"] == str(root / "shared/p/queue"), made
    assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
    assert all(p.stat().st_uid == user.uid for p in (root, *root.iterdir()))
    assert ctx("queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB).rc == 0
    assert (root / "shared/p/queue/pending/j.req.json").is_file()

    # What each reports as its default when CTX_STORAGE is set but empty: nothing is made.
    for_user = as_user(
        user, {**env, "CTX_STORAGE": ""}, "queue", "status", "--project", "p", cwd=home
    )
    refused(for_user, 1, "EINVAL", "CTX_STORAGE is set but empty", f"the default ({root})")
    for_root = ctx_run("queue", "status", "--project", "p", env=clean_env(CTX_STORAGE=""))
    refused(for_root, 1, "EINVAL", f"the default ({SYSTEM_ROOT})")

    subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
    try:
        before = snapshot(root)
        listed = ctx("queue", "list", "--project", "p")
        assert (listed.rc, listed.out.split()) == (0, ["pending", "j.req.json"]), listed
        for args in (
            ["queue", "status", "--project", "p"],
            ["policy", "check", str(root / "tool/fs.read.d/policy")],
        ):
            assert ctx(*args).rc == 0, ctx(*args)
        for args, where in (
            (["queue", "publish", "--project", "p", "-"], root / "shared/p/queue/inbox"),
            (["queue", "claim", "--project", "p"], root / "shared/p/queue/claimed"),
            (["shared", "create", "s"], root / "shared"),
            (["bootstrap"], root),
        ):
            line = refused(ctx(*args, stdin=JOB), 1, "EACCES", f"may not write in {where} (")
            assert "you own it, but its mode leaves you out: 'chmod u+w' it" in line, line
            assert "use a storage root of your own" not in line, line  # this one is theirs
        assert snapshot(root) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)

    claimed = ctx("queue", "claim", "--project", "p")
    assert (claimed.rc, claimed.out) == (0, "j.req.json\n"), claimed


@needs_root
def test_a_root_another_user_owns_is_read_but_never_written_and_names_the_users_own(
    place: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1/R-4: the test user, given a root that ``nobody`` made and owns, may list its objects
    but every write is EACCES naming the directory, its owner uid and 'use a storage root of
    your own', with the user's own default root spelled out — and that root is not made."""
    user = unprivileged_user
    theirs = place / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    nobody_env = {"PATH": PATH, "HOME": "/nonexistent"}
    for args in (["bootstrap"], ["queue", "init", "--project", "p"]):
        made = subprocess.run(
            [CTX, "--storage", str(theirs), *args],
            user=65534, group=65534, extra_groups=[], env=nobody_env, cwd=place,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    assert all(p.stat().st_uid == 65534 for p in (theirs, *theirs.iterdir()))
    home = place / "home"
    own_root = home / "xdg" / "cortexfs" / "storage" / "current"
    your_own = (
        "use a storage root of your own (--storage DIR or CTX_STORAGE; "
        f"without them yours is {own_root})"
    )
    env = {"PATH": PATH, "HOME": str(home), "XDG_DATA_HOME": str(home / "xdg")}
    before = snapshot(theirs)

    def ctx(*args: str) -> Run:
        return as_user(user, env, "--storage", str(theirs), *args, stdin=JOB, cwd=place)

    listed = ctx("object", "list")
    assert listed.rc == 0 and "fs.read" in listed.out, listed
    for args, action, where in (
        (["bootstrap"], "write in", theirs),
        (["queue", "init", "--project", "q"], "write in", theirs / "shared"),
        (["queue", "publish", "--project", "p", "-"], "enter", theirs / "shared/p"),
        (["queue", "status", "--project", "p"], "enter", theirs / "shared/p"),
    ):
        line = refused(ctx(*args), 1, "EACCES", f"uid {user.uid} may not {action} {where} (")
        assert "owner uid 65534" in line, line
        assert your_own in line, line
    assert snapshot(theirs) == before
    assert not home.exists()


@needs_root
def test_two_roots_side_by_side_share_no_queue_agent_tool_or_session(place: Path) -> None:
    """R-1/R-4, S-1: two roots on one machine are two worlds: a job, an agent, an installed
    tool, an agent's session and a worker's results made in one never show in the other, even
    when both hold a space and an agent of the same names."""
    a, b = place / "a", place / "b"
    for root in (a, b):
        assert on(root, "queue", "init", "--project", "p").rc == 0
    stat_agent(a)
    manifest = place / "hello.json"
    manifest.write_text(json.dumps(MANIFEST))
    assert on(a, "object", "install", str(manifest), "--tier", "system").rc == 0
    for name in ("a1", "a2"):
        assert on(a, "queue", "publish", "--project", "p", "--name", name, "-", input=JOB).rc == 0
    ran, result = native_stat(a)
    assert result["status"] == "ok", ran

    # B knows nothing of A's job, agent, tool or session.
    status_b = on(b, "queue", "status", "--project", "p", "--json")
    assert status_b.rc == 0 and status_b.json()["counts"]["pending"] == 0, status_b
    assert on(b, "queue", "claim", "--project", "p").rc == 3
    assert on(b, "agent", "list").out == ""
    assert "hello.say" not in on(b, "object", "list").out
    refused(on(b, "session", "show", "ci"), 1, "ENOENT", "'ci'")
    not_there = on(b, "run", "--agent", "ci", "fs.stat", "/ctx")
    assert not_there.rc == 126 and "there is no agent 'ci'" in not_there.err, not_there
    assert not (b / "home").exists() or list((b / "home").iterdir()) == []

    # An agent of the same name in B works B's queue only; A's jobs stay pending.
    stat_agent(b)
    assert on(b, "queue", "publish", "--project", "p", "--name", "b1", "-", input=JOB).rc == 0
    worked = on(b, "queue", "work", "--project", "p", "--drain", "--agent", "ci")
    assert worked.rc == 0, worked
    assert json.loads((b / "shared/p/queue/done/b1.req.json.result").read_text())["status"] == "ok"
    pending_a = on(a, "queue", "list", "--project", "p", "--state", "pending")
    assert pending_a.out.split() == ["a1.req.json", "a2.req.json"], pending_a
    assert list((a / "shared/p/queue/done").iterdir()) == []
    assert [str(b), "/ctx", "ro"] in json.loads((b / "agent/ci.d/mount").read_text())
    assert [str(a), "/ctx", "ro"] in json.loads((a / "agent/ci.d/mount").read_text())

    sessions_a = on(a, "session", "list", "ci").out.split()
    sessions_b = on(b, "session", "list", "ci").out.split()
    assert sessions_a == ["default"], sessions_a
    assert "default" not in sessions_b and sessions_b, sessions_b
    events_b = on(b, "session", "show", "ci", "--session", sessions_b[0]).out
    assert "b1.req.json" in events_b and "a1.req.json" not in events_b, events_b
    assert "b1.req.json" not in on(a, "session", "show", "ci").out
