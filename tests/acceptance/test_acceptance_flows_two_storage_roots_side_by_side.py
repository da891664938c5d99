"""Two or three storage roots on one machine, side by side (SPEC R-1..R-5, §2.4, §4, §8, §13
F-1).

Each root is chosen in every way R-1 and docs/queue.md allow — ``ctx --storage DIR``, the
subcommand's ``--storage``, ``$CTX_STORAGE``, both at once (``--storage`` wins), relative
paths, a trailing slash, a root reached through a symbolic link, one root nested inside the
``data/`` of another's space — and each root holds objects of the same names: a tool ``who``
(whose program says which root it came from), an agent ``coder``, a space and queue ``proj``.
Tools, workers, ``recover``, the session readers, agent terminals and ``ctx mount`` (one mount
per root at once) then run against them; nothing of one root may be read, changed or shown
through the other, and every message names the root the command was given.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    Run,
    clean_env,
    ctx_run,
    kill_processes_of,
    mounted_at,
    needs_fuse_as_root,
    read_jsonl,
    request,
    scratch_top,
    serving,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (agents run as nobody)")
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse") or os.geteuid() != 0,
    reason="agent terminals need root, bubblewrap and /dev/fuse",
)

# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory every uid may search (agents run as ``nobody``), below
    /tmp/<this file's stem>-<uid>/; whatever ran or was mounted below it is ended after."""
    top = scratch_top(__file__)
    top.mkdir(mode=0o755, exist_ok=True)
    top.chmod(0o755)
    path = Path(tempfile.mkdtemp(dir=top))
    path.chmod(0o755)
    yield path
    kill_processes_of(path)
    with open("/proc/self/mountinfo") as table:
        leftovers = [line.split()[4] for line in table if line.split()[4].startswith(str(path))]
    for where in sorted(leftovers, key=len, reverse=True):
        subprocess.run(["umount", "-l", where], check=False)
    shutil.rmtree(path, ignore_errors=True)


def on(root: Path | str, *args, **kw) -> Run:
    """``ctx --storage ROOT ARGS`` with no CTX_ setting in the environment."""
    return ctx_run("--storage", root, *args, **kw)


def via_env(root: Path | str, *args, **kw) -> Run:
    """``CTX_STORAGE=ROOT ctx ARGS``."""
    kw.setdefault("env", clean_env(CTX_STORAGE=str(root)))
    return ctx_run(*args, **kw)


def fresh_root(template: Path, where: Path) -> Path:
    """A bootstrapped root at ``where`` (a copy of the session's bootstrapped template, with
    the queue of ``proj``), reachable by every uid."""
    root = copy_of_root(template, where)
    root.chmod(0o755)
    return root


def furnish(root: Path, tag: str, manifests: Path) -> None:
    """Give ``root`` a tool ``who`` whose program prints ``root-TAG`` and then its input, and
    an agent ``coder`` (label ``coder_t``, running as nobody) allowed to run it in both layers
    of P-6."""
    program = f"#!/bin/sh\necho root-{tag}\ncat\n"
    manifest = tool_manifest(manifests / tag, "who", program)
    (manifests / tag / "who.sh").chmod(0o755)
    made = on(root, "object", "install", "--source", root, manifest, "--tier", "system")
    assert made.rc == 0, made
    with (root / "tool" / "who.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:who execute\n")
    req = {"name": "coder", "label": "coder_t", "tools": ["who"]}
    created = on(root, "agent", "create", "-", "--json", input=json.dumps(req))
    assert created.rc == 0, created


def events_of(root: Path, session: str = "default", agent: str = "coder") -> list[dict]:
    path = root / "home" / str(NOBODY) / "agent" / agent / "session" / session / "events.jsonl"
    return read_jsonl(path)


def calls_in(root: Path, session: str = "default") -> set[str]:
    return {e["call"] for e in events_of(root, session) if "call" in e}


def job(tag: str) -> str:
    return json.dumps(request("who", input={"from": tag}))


# ------------------------------------------------------------------------------ bootstrap


def test_bootstrap_three_roots_each_way_of_naming_one(place: Path) -> None:
    """R-1, R-5: ``--storage`` relative with a trailing slash, ``$CTX_STORAGE`` relative, and
    both at once each bootstrap exactly the root named (``--storage`` beating the
    environment); each report names its own absolute root, and each root's ``bin/ctxterm``
    names itself, not a sibling."""
    first = ctx_run("bootstrap", "--storage", "roots/a/", cwd=place)
    assert first.rc == 0, first
    a, b, c = (place / "roots" / n for n in "abc")
    assert first.out.splitlines()[0] == f"storage root: {a}", first

    second = via_env("roots/b", "bootstrap", cwd=place)
    assert second.rc == 0, second
    assert second.out.splitlines()[0] == f"storage root: {b}", second

    before_b = snapshot(b)
    third = ctx_run(
        "--storage", "roots/c", "bootstrap", env=clean_env(CTX_STORAGE="roots/b"), cwd=place
    )
    assert third.rc == 0, third
    assert third.out.splitlines()[0] == f"storage root: {c}", third
    assert snapshot(b) == before_b, "the root in CTX_STORAGE was changed"

    for root in (a, b, c):
        assert sorted(os.listdir(root)) == ["agent", "bin", "home", "model", "shared", "tool"]
        ctxterm = (root / "bin" / "ctxterm").read_text()
        assert f"storage={str(root)!r}" in ctxterm, ctxterm
        for other in {a, b, c} - {root}:
            assert str(other) not in ctxterm

    # Bootstrapping one again (by its absolute path with a slash) creates nothing there and
    # changes nothing in the others.
    before = {r: snapshot(r) for r in (b, c)}
    again = ctx_run("bootstrap", "--storage", f"{a}/")
    assert again.rc == 0, again
    assert again.out.splitlines()[0] == f"storage root: {a}", again
    assert "created" not in again.out, again.out
    assert {r: snapshot(r) for r in (b, c)} == before


def test_subcommand_storage_beats_group_storage_beats_environment(
    _template: Path, place: Path
) -> None:
    """R-1, §2.4: with ``CTX_STORAGE=B``, ``ctx --storage A queue …`` acts on A; a
    ``--storage`` after the subcommand naming another root than the group's is a usage error
    (EINVAL, exit 2) acting on neither, and the same root given both ways (one through
    another spelling of it) is one root; every queue path printed is the root acted on."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    env_b = clean_env(CTX_STORAGE=str(b))
    before_b = snapshot(b)

    published = ctx_run(
        "--storage", "a", "queue", "publish", "--project", "proj", "--name", "j1", "-",
        input=job("A"), env=env_b, cwd=place,
    )  # fmt: skip
    assert published.rc == 0 and published.out == "j1.req.json\n", published
    assert (a / "shared/proj/queue/pending/j1.req.json").is_file()
    assert snapshot(b) == before_b

    two = ctx_run(
        "--storage", b, "queue", "status", "--project", "proj", "--storage", "a/",
        env=env_b, cwd=place,
    )  # fmt: skip
    assert (two.rc, two.out) == (2, ""), two
    assert "ctx: EINVAL: two storage roots given" in two.err, two
    status = ctx_run(
        "--storage", a, "queue", "status", "--project", "proj", "--storage", "a/",
        env=env_b, cwd=place,
    )  # fmt: skip
    assert status.rc == 0, status
    assert status.out.splitlines()[0] == f"queue: {a}/shared/proj/queue", status
    assert "pending           1" in status.out, status

    listed = ctx_run("queue", "list", "--project", "proj", env=env_b)
    assert listed.rc == 0 and listed.out == "", listed


def test_object_install_naming_two_roots_installs_nowhere(_template: Path, place: Path) -> None:
    """T-8 / docs/tools.md: ``--source B`` with ``--storage A`` (before or after ``object
    install``) names two roots: ``EINVAL``, exit 2, and neither root is changed; the same
    root given both ways (one through a relative path with a trailing slash) installs
    there only."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    manifest = tool_manifest(place / "m", "who", "#!/bin/sh\necho hi\n")
    before = snapshot(a), snapshot(b)
    for argv in (
        ["--storage", a, "object", "install", "--source", b, manifest, "--tier", "system"],
        ["object", "install", "--storage", a, "--source", b, manifest, "--tier", "system"],
    ):
        refused = ctx_run(*argv, env=clean_env(CTX_STORAGE=str(a)))
        assert refused.rc == 2 and "EINVAL" in refused.err, refused
        assert str(a) in refused.err and str(b) in refused.err, refused
        assert (snapshot(a), snapshot(b)) == before

    same = ctx_run(
        "--storage", "a/", "object", "install", "--source", a, manifest, "--tier", "system",
        cwd=place,
    )  # fmt: skip
    assert same.rc == 0, same
    assert str(a / "tool" / "who") in same.out, same
    assert snapshot(b) == before[1]


# ------------------------------------------------------------------------------ same names


@needs_root
def test_same_names_in_two_roots_each_run_reads_and_records_its_own(
    _template: Path, place: Path
) -> None:
    """R-1, T-7, S-1: tool ``who`` and agent ``coder`` exist in both roots; a run chosen by
    ``--storage`` (relative), by ``CTX_STORAGE`` (relative), or by both at once runs that
    root's program and records the call in that root's session and tool log only; readers
    (``agent show``, ``object which``, ``session list``/``show``) answer from their own root."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    furnish(a, "A", place / "m")
    furnish(b, "B", place / "m")

    ran_a = ctx_run("--storage", "a", "run", "--agent", "coder", "who", cwd=place)
    ran_b = ctx_run("run", "--agent", "coder", "who", env=clean_env(CTX_STORAGE="b"), cwd=place)
    ran_both = ctx_run(
        "run", "--storage", "a/", "--agent", "coder", "who",
        env=clean_env(CTX_STORAGE=str(b)), cwd=place,
    )  # fmt: skip
    for ran, tag in ((ran_a, "A"), (ran_b, "B"), (ran_both, "A")):
        assert ran.rc == 0 and ran.out.startswith(f"root-{tag}\n"), ran

    assert len(calls_in(a)) == 2 and len(calls_in(b)) == 1
    assert not calls_in(a) & calls_in(b)
    log_a = (a / "tool/who.d/log").read_text()
    log_b = (b / "tool/who.d/log").read_text()
    for call in calls_in(a):
        assert call in log_a and call not in log_b
    for call in calls_in(b):
        assert call in log_b and call not in log_a

    for root, other in ((a, b), (b, a)):
        shown = on(root, "agent", "show", "coder", "--json")
        assert shown.rc == 0, shown
        assert str(root) in shown.out and str(other) not in shown.out, shown
        which = on(root, "object", "which", "who")
        assert which.rc == 0 and str(root) in which.out, which
        assert str(other) not in which.out
        sessions = on(root, "session", "list", "coder", "--json")
        assert sessions.rc == 0, sessions
        paths = [s["path"] for s in sessions.json()]
        assert paths and all(p.startswith(f"{root}/") for p in paths), sessions
        timeline = on(root, "session", "show", "coder")
        assert timeline.rc == 0, timeline
        for call in calls_in(other):
            assert call not in timeline.out


@needs_root
def test_refusals_name_the_root_they_were_given(_template: Path, place: Path) -> None:
    """§2.4 / docs/queue.md: a refusal names the root the command was given (made absolute,
    without the trailing slash) and the command it suggests carries that ``--storage``; the
    same command through ``CTX_STORAGE`` names the other root, and leaves the option out."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    env_b = clean_env(CTX_STORAGE=str(b))

    missing_queue = ctx_run(
        "--storage", "a/", "queue", "status", "--project", "nosuch", env=env_b, cwd=place
    )
    assert missing_queue.rc == 1, missing_queue
    assert f"no queue at {a}/shared/nosuch/queue" in missing_queue.err, missing_queue
    assert f"'ctx queue init --storage {a} --project nosuch'" in missing_queue.err
    assert str(b) not in missing_queue.err

    from_env = ctx_run("queue", "status", "--project", "nosuch", env=env_b)
    assert f"no queue at {b}/shared/nosuch/queue" in from_env.err, from_env
    assert "'ctx queue init --project nosuch'" in from_env.err, from_env

    ghost = ctx_run("agent", "show", "ghost", "--storage", "a", env=env_b, cwd=place)
    assert ghost.rc == 1, ghost
    assert f"{a}/agent/ghost does not exist" in ghost.err, ghost
    assert f"'ctx agent list --storage {a}'" in ghost.err, ghost
    assert str(b) not in ghost.err

    nothing = ctx_run("--storage", "a", "run", "--agent", "ghost", "who", env=env_b, cwd=place)
    assert nothing.rc == 126 and f"{a}/agent/ghost" in nothing.err, nothing
    assert str(b) not in nothing.err


@needs_root
def test_agent_of_a_copied_root_is_refused_naming_both_roots(_template: Path, place: Path) -> None:
    """P-5 step 3 / docs/policy.md: an agent copied with its root (``cp -a A A2``) keeps a
    ``/ctx`` mount naming A; run in A2 it is refused, the message naming A as the root the
    agent was made for and A2 as this root, and A's session is not written."""
    a = fresh_root(_template, place / "a")
    furnish(a, "A", place / "m")
    copy = place / "a2"
    subprocess.run(["cp", "-a", str(a), str(copy)], check=True)
    before = snapshot(a)

    ran = on("a2", "run", "--agent", "coder", "who", cwd=place)
    assert ran.rc == 126, ran
    assert "EACCES" in ran.err and "step 3" in ran.err, ran
    assert f"({a}, not this root {copy})" in ran.err, ran
    assert snapshot(a) == before
    assert on(a, "run", "--agent", "coder", "who").out.startswith("root-A\n")


def test_manual_pages_come_from_the_root_given(_template: Path, place: Path) -> None:
    """D-1, R-1: ``ctx man`` reads the bundle of the root it is given (``--storage`` beating
    ``CTX_STORAGE``): a page edited in b is shown from b only, with a note naming b's page."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    page_b = b / "shared/cortexfs-docs/man/ctx.agent.md"
    with page_b.open("a") as page:
        page.write("\nLOCAL-NOTE-OF-B\n")
    from_b = ctx_run("man", "agent", "--storage", "b/", env=clean_env(CTX_STORAGE=str(a)),
                     cwd=place)  # fmt: skip
    assert from_b.rc == 0 and "LOCAL-NOTE-OF-B" in from_b.out, from_b
    assert str(page_b) in from_b.err, from_b
    from_a = ctx_run("--storage", a, "man", "agent", env=clean_env(CTX_STORAGE=str(b)))
    assert from_a.rc == 0 and "LOCAL-NOTE-OF-B" not in from_a.out, from_a
    assert from_a.err == "", from_a
    described = on(b, "man", "agent", "--json")
    assert described.json()["path"] == str(page_b), described


def test_manual_notes_suggest_bootstrap_of_the_root_given(_template: Path, place: Path) -> None:
    """D-1, R-1 / docs/queue.md: a command a message suggests names the ``--storage`` the
    command was given; ``ctx man --storage B`` meeting a stale page, and a missing one, must
    suggest ``ctx bootstrap --storage B``, not a bootstrap of the default root."""
    fresh_root(_template, place / "a")
    b = fresh_root(_template, place / "b")
    with (b / "shared/cortexfs-docs/man/ctx.agent.md").open("a") as page:
        page.write("\nLOCAL-NOTE-OF-B\n")
    (b / "shared/cortexfs-docs/man/ctx.tool.md").unlink()
    for topic in ("agent", "tool"):
        shown = on(b, "man", topic)
        assert shown.rc == 0 and "ctx bootstrap" in shown.err, shown
        assert f"'ctx bootstrap --storage {b}'" in shown.err, shown


# ------------------------------------------------------------------------------ symlinks


@needs_root
def test_root_through_a_symlink_is_the_same_root_and_no_other(_template: Path, place: Path) -> None:
    """R-1 / docs/queue.md: ``current -> a`` names root a: an agent created through the link
    records a's real path as its ``/ctx`` source, runs through the link and through a's own
    path land in one session of a, and root b (same names) is untouched throughout."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    furnish(b, "B", place / "m")
    (place / "current").symlink_to("a")
    link = place / "current"
    manifest = tool_manifest(place / "m" / "A", "who", "#!/bin/sh\necho root-A\n")
    (manifest.parent / "who.sh").chmod(0o755)
    installed = on(f"{link}/", "object", "install", "--source", link, manifest, "--tier", "system")
    assert installed.rc == 0, installed
    with (a / "tool" / "who.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:who execute\n")
    before_b = snapshot(b)

    req = {"name": "coder", "label": "coder_t", "tools": ["who"]}
    made = via_env("current", "agent", "create", "-", input=json.dumps(req), cwd=place)
    assert made.rc == 0, made
    mounts = json.loads((a / "agent" / "coder.d" / "mount").read_text())
    assert [str(a), "/ctx", "ro"] in mounts, mounts

    through_link = via_env(link, "run", "--agent", "coder", "who")
    direct = on(a, "run", "--agent", "coder", "who")
    assert through_link.rc == 0 and through_link.out == "root-A\n", through_link
    assert direct.rc == 0 and direct.out == "root-A\n", direct
    assert len(calls_in(a)) == 2
    assert snapshot(b) == before_b

    shown = on(link, "agent", "show", "coder")
    assert f"mount: {a} at /ctx (ro)" in shown.out, shown


def test_symlinked_root_leading_nowhere_makes_no_root(_template: Path, place: Path) -> None:
    """docs/queue.md: a link to a release moved away is ``ENOENT`` naming the link and where
    it led, for bootstrap too, which makes no empty root there nor in the sibling root."""
    b = fresh_root(_template, place / "b")
    (place / "current").symlink_to("release-1")
    before_b = snapshot(b)
    for run in (
        on(place / "current", "bootstrap"),
        via_env(place / "current", "queue", "status", "--project", "proj"),
    ):
        assert run.rc == 1 and "ENOENT" in run.err, run
        assert f"{place}/current" in run.err and "release-1" in run.err, run
        assert str(b) not in run.err
    assert not (place / "release-1").exists()
    assert snapshot(b) == before_b


# ------------------------------------------------------------------------------ nested root


def test_root_nested_in_another_roots_data_is_only_data_there(_template: Path, place: Path) -> None:
    """R-2, X-1, Q-8: root c lives in ``a/shared/proj/data/c``; a's queue commands,
    ``recover --reconcile``, ``bootstrap`` and ``object list`` neither count nor change c's
    queue, tools or files, and c's commands never see a's jobs."""
    a = fresh_root(_template, place / "a")
    c = a / "shared" / "proj" / "data" / "c"
    booted = ctx_run("bootstrap", "--storage", "a/shared/proj/data/c/", cwd=place)
    assert booted.rc == 0, booted
    assert booted.out.splitlines()[0] == f"storage root: {c}", booted
    assert on(c, "queue", "init", "--project", "proj").rc == 0

    for n in range(2):
        published = on(c, "queue", "publish", "--project", "proj", "-", input=job(f"c{n}"))
        assert published.rc == 0, published
    published = on(a, "queue", "publish", "--project", "proj", "--name", "ja", "-", input=job("a"))
    assert published.rc == 0, published
    stray = c / "shared" / "proj" / "queue" / "inbox" / "old.publish.tmp"
    stray.write_text("{}")
    os.utime(stray, (0, 0))

    before_c = snapshot(c)
    for argv in (
        ("queue", "recover", "--project", "proj", "--reconcile", "--grace", "0", "--json"),
        ("bootstrap",),
        ("queue", "init", "--project", "proj"),
        ("shared", "create", "proj"),
    ):
        ran = on(a, *argv)
        assert ran.rc == 0, ran
        assert str(c) not in ran.out + ran.err, ran
    assert snapshot(c) == before_c

    status_a = on(a, "queue", "status", "--project", "proj")
    assert status_a.rc == 0 and "pending           1" in status_a.out, status_a
    listed_a = on(a, "queue", "list", "--project", "proj")
    assert listed_a.out == "pending    ja.req.json\n", listed_a
    listed_c = on(c, "queue", "list", "--project", "proj", "--state", "pending")
    assert len(listed_c.lines()) == 2 and "ja.req.json" not in listed_c.out, listed_c

    tools_a = on(a, "object", "list", "--json")
    assert tools_a.rc == 0 and str(c) not in tools_a.out, tools_a

    # c's own recover sees its stray temp file; a's never did.
    swept = on(c, "queue", "recover", "--project", "proj", "--reconcile", "--grace", "0")
    assert swept.rc == 0 and "old.publish.tmp" in swept.out, swept
    assert not stray.exists()


# ------------------------------------------------------------------------------ workers


@needs_root
def test_two_workers_on_two_roots_drain_only_their_own_queue(_template: Path, place: Path) -> None:
    """W-1, W-2, I-1: the same job names are published in both roots; two ``queue work
    --drain`` run at once, one told its root by ``--storage`` (relative), the other by
    ``CTX_STORAGE``; each job is done in its own root by that root's tool, and the workers'
    sessions are in their own roots."""
    # Bootstrapped here rather than copied: a worker refuses core tools that this ctx's
    # sources would not install (docs/workers.md), so they are made by the ctx that runs.
    a, b = place / "a", place / "b"
    for root in (a, b):
        assert on(root, "bootstrap").rc == 0
        assert on(root, "queue", "init", "--project", "proj").rc == 0
    furnish(a, "A", place / "m")
    furnish(b, "B", place / "m")
    names = [f"job{n}" for n in range(4)]
    for root, tag in ((a, "A"), (b, "B")):
        for name in names:
            published = on(root, "queue", "publish", "--project", "proj", "--name", name, "-",
                           input=job(tag))  # fmt: skip
            assert published.rc == 0, published

    common = ["queue", "work", "--project", "proj", "--agent", "coder", "--drain"]
    workers = [
        subprocess.Popen(
            [*CTX_ARGV, "--storage", "a", *common], cwd=place, env=clean_env(CTX_STORAGE=str(b)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ),
        subprocess.Popen(
            [*CTX_ARGV, *common], cwd=place, env=clean_env(CTX_STORAGE="b"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ),
    ]  # fmt: skip
    said = [w.communicate(timeout=60) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], said

    for root, tag in ((a, "A"), (b, "B")):
        done = root / "shared" / "proj" / "queue" / "done"
        assert sorted(os.listdir(done)) == sorted(
            [f"{n}.req.json" for n in names] + [f"{n}.req.json.result" for n in names]
        )
        for name in names:
            outcome = json.loads((done / f"{name}.req.json.result").read_text())
            assert outcome["status"] == "ok", outcome
            assert outcome["output"].startswith(f"root-{tag}\n"), outcome
            assert json.loads(outcome["output"].split("\n", 1)[1]) == {"from": tag}
        assert len(calls_in(root, "worker")) == len(names)


@needs_root
def test_recover_requeues_only_in_the_root_it_was_given(_template: Path, place: Path) -> None:
    """Q-5, Q-6, I-5: a job of the same name is claimed in both roots by a process that has
    ended; the claim's note names its own root's ``recover``; ``recover`` on one root
    (given as ``a/``) requeues there only, and the other root's claim stays as it was until
    its own recover."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    gone = subprocess.Popen(["true"])
    gone.wait()
    for root in (a, b):
        assert on(root, "queue", "publish", "--project", "proj", "--name", "j", "-",
                  input=job("x")).rc == 0  # fmt: skip
        claimed = on(root, "queue", "claim", "--project", "proj", "--pid", str(gone.pid))
        assert claimed.rc == 0 and claimed.out == "j.req.json\n", claimed
        assert f"'ctx queue recover --storage {root} --project proj'" in claimed.err, claimed
    queue_b = b / "shared" / "proj" / "queue"
    before_b = snapshot(queue_b)

    recovered = ctx_run(
        "--storage", "a/", "queue", "recover", "--project", "proj", "--json",
        cwd=place, env=clean_env(CTX_STORAGE=str(b)),
    )  # fmt: skip
    assert recovered.rc == 0, recovered
    assert recovered.json()["requeued"] != [], recovered
    assert (a / "shared/proj/queue/pending/j.req.json").is_file()
    assert snapshot(queue_b) == before_b

    shown = on(b, "queue", "show", "--project", "proj", "j", "--json")
    assert shown.rc == 0 and "claimed" in shown.out, shown
    again = via_env(b, "queue", "recover", "--project", "proj")
    assert again.rc == 0, again
    assert (queue_b / "pending" / "j.req.json").is_file()


# ------------------------------------------------------------------------------ sessions


@needs_root
def test_session_follow_on_one_root_shows_none_of_the_others_calls(
    _template: Path, place: Path
) -> None:
    """S-1, S-5: ``session tail --follow`` of coder in root a keeps printing a's new calls
    and none of b's, though b's agent, session and tool have the same names."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    furnish(a, "A", place / "m")
    furnish(b, "B", place / "m")
    assert on(a, "run", "--agent", "coder", "who").rc == 0
    (first_a,) = calls_in(a)
    out = place / "follow.out"
    with open(out, "wb") as sink:
        follower = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", "coder", "-f", "-n", "0", "--json"],
            stdout=sink, stderr=subprocess.STDOUT, env=clean_env(CTX_STORAGE="a/"), cwd=place,
        )  # fmt: skip
    try:
        for _ in range(2):
            assert on(b, "run", "--agent", "coder", "who").rc == 0
            seen = calls_in(a)
            assert on(a, "run", "--agent", "coder", "who").rc == 0
            (new_a,) = calls_in(a) - seen
            assert wait_for(lambda call=new_a: call in out.read_text(), 20), out.read_text()
    finally:
        follower.terminate()
        follower.wait(timeout=30)
    shown = out.read_text()
    for call in calls_in(b):
        assert call not in shown, shown
    followed = [json.loads(line) for line in shown.splitlines() if line.startswith("{")]
    assert {e["call"] for e in followed if "call" in e} == calls_in(a) - {first_a}


# ------------------------------------------------------------------------------ terminals


@needs_bwrap
def test_terminals_of_the_same_agent_and_session_in_two_roots(_template: Path, place: Path) -> None:
    """A-1, A-2: coder's terminal in one session name is started in both roots; each root's
    socket link leads to a socket of its own, each view serves its own root's ``who``;
    stopping b's leaves a's running and reachable, and a's stop then ends a's."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    furnish(a, "A", place / "m")
    furnish(b, "B", place / "m")
    session = "s" + uuid.uuid4().hex[:12]
    started: list[Path] = []
    try:
        for root in (a, b):
            start = ctx_run(
                "agent", "start", "coder", "--session", session, "--no-workspace", "--json",
                "--storage", root, env=clean_env(CTX_STORAGE=str(a if root == b else b)),
            )  # fmt: skip
            assert start.rc == 0, start
            started.append(root)
            told = start.json()
            assert told["socket"].startswith(f"{root}/"), told
        link = {r: r / f"home/{NOBODY}/agent/coder/session/{session}/terminal/main.sock"
                for r in (a, b)}  # fmt: skip
        real = {r: os.path.realpath(link[r]) for r in (a, b)}
        assert real[a] != real[b], real
        for root in (a, b):
            view = Path(real[root]).parent / "private" / "ctx"
            other = "B" if root == a else "A"
            tag = "A" if root == a else "B"
            assert (view / "tool" / "who").read_text().startswith(f"#!/bin/sh\necho root-{tag}")
            assert f"root-{other}" not in (view / "tool" / "who").read_text()

        stopped = on(b, "agent", "stop", "coder", "--session", session, "--json")
        assert stopped.rc == 0, stopped
        started.remove(b)
        assert not os.path.lexists(link[b])
        assert os.path.exists(real[a]) and os.path.realpath(link[a]) == real[a]
        pid_a = int((Path(real[a]).parent / "pid").read_text())
        os.kill(pid_a, 0)

        stopped = on(a, "agent", "stop", "coder", "--session", session, "--json")
        assert stopped.rc == 0 and stopped.json()["pid"] == pid_a, stopped
        started.remove(a)
    finally:
        for root in started:
            on(root, "agent", "stop", "coder", "--session", session)


# ------------------------------------------------------------------------------ mounts


@contextlib.contextmanager
def serving_from_env(root: Path | str, where: Path, cwd: Path) -> Iterator[subprocess.Popen]:
    """``CTX_STORAGE=ROOT ctx mount WHERE`` (run in ``cwd``) until the block ends."""
    where.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [*CTX_ARGV, "mount", str(where)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env=clean_env(CTX_STORAGE=str(root)), cwd=cwd,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(where) or proc.poll() is not None, MOUNT_WAIT)
        assert mounted_at(where), proc.communicate()[1]
        yield proc
    finally:
        if mounted_at(where):
            ctx_run("umount", where, timeout=30)
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@needs_fuse_as_root
def test_two_mounts_at_once_each_serves_its_own_root(_template: Path, place: Path) -> None:
    """F-1, R-1: root a mounted with ``--storage`` and root b with a relative
    ``CTX_STORAGE``, at the same time; each mount shows its own root's ``who``, a file
    written through one lands in that root only, and unmounting one leaves the other
    serving."""
    a, b = fresh_root(_template, place / "a"), fresh_root(_template, place / "b")
    furnish(a, "A", place / "m")
    furnish(b, "B", place / "m")
    m1, m2 = place / "m1", place / "m2"
    m1.mkdir()
    with serving_from_env("b", m2, place):
        with serving(a, m1):
            assert (m1 / "tool" / "who").read_text() == (a / "tool" / "who").read_text()
            assert (m2 / "tool" / "who").read_text() == (b / "tool" / "who").read_text()
            assert "root-A" in (m1 / "tool/who").read_text()
            assert "root-B" in (m2 / "tool/who").read_text()
            (m1 / "shared/proj/data/note").write_text("for a\n")
            (m2 / "shared/proj/data/note").write_text("for b\n")
            assert (a / "shared/proj/data/note").read_text() == "for a\n"
            assert (b / "shared/proj/data/note").read_text() == "for b\n"
            done = via_env(m1, "queue", "publish", "--project", "proj", "--name", "through",
                           "-", input=job("m"))  # fmt: skip
            assert done.rc == 0, done
            assert (a / "shared/proj/queue/pending/through.req.json").is_file()
            assert not (b / "shared/proj/queue/pending/through.req.json").exists()
            assert (m2 / "shared/proj/queue/pending").is_dir()
            assert os.listdir(m2 / "shared/proj/queue/pending") == []
        assert not mounted_at(m1)
        assert mounted_at(m2)
        assert "root-B" in (m2 / "tool/who").read_text()
        assert os.listdir(m1) == []


@needs_fuse_as_root
def test_mount_of_nested_root_beside_the_outer_roots_mount(_template: Path, place: Path) -> None:
    """F-1: root c nested in a's ``shared/proj/data``; a and c mounted at once: c's mount
    shows c's root ABI with c's tools, a's shows c only as data; a mount point in a's data
    is outside c (c mounts there), but inside a (a is refused there, naming a)."""
    a = fresh_root(_template, place / "a")
    furnish(a, "A", place / "m")
    c = fresh_root(_template, a / "shared/proj/data/c")
    furnish(c, "C", place / "m")
    m1 = place / "m1"
    m1.mkdir()
    inner = a / "shared/proj/data/mnt"
    inner.mkdir()
    refused = on(a, "mount", inner)
    assert refused.rc == 1 and "EINVAL" in refused.err, refused
    assert f"inside the storage root {a}" in refused.err, refused
    assert not mounted_at(inner)
    (place / "m3").mkdir()
    with serving(a, m1), serving(c, place / "m3") as third:
        assert "root-C" in (third.where / "tool/who").read_text()
        assert "root-A" in (m1 / "tool/who").read_text()
        assert (m1 / "shared/proj/data/c/tool/who").read_text() == (c / "tool/who").read_text()
        assert sorted(os.listdir(third.where)) == sorted(os.listdir(c))
        assert sorted(os.listdir(third.where / "shared")) == sorted(os.listdir(c / "shared"))


@needs_fuse_as_root
def test_mounting_a_root_reached_through_another_mount_names_the_real_root(
    _template: Path, place: Path
) -> None:
    """F-1 / docs/mount.md: a storage root on a CortexFS mount is ``EINVAL``; the refusal
    must lead to the root to give instead: for c nested in a and reached through a's mount
    m1, that is c's own path in a — the directory below the mount point in the root the
    mount serves — not a (which the mount serves, a different root)."""
    a = fresh_root(_template, place / "a")
    c = fresh_root(_template, a / "shared/proj/data/c")
    m1, m2 = place / "m1", place / "m2"
    m1.mkdir()
    m2.mkdir()
    with serving(a, m1):
        through = m1 / "shared/proj/data/c"
        refused = on(through, "mount", m2)
        assert refused.rc == 1 and "EINVAL" in refused.err, refused
        assert not mounted_at(m2)
        below = c.relative_to(a)
        assert f"give --storage the directory {below} of the storage root that mount serves" in (
            refused.err
        ), refused
        assert str(m1) in refused.err, refused


# ------------------------------------------------------------------------------ another uid


def test_user_default_root_and_named_roots_of_another_uid(
    unprivileged_user: UnprivilegedUser, _template: Path, place: Path
) -> None:
    """R-1: as an ordinary user, ``CTX_STORAGE`` (relative) beats the XDG default, which is
    left unmade; a refusal in root's root names that root and, as the user's own, the XDG
    default ``$XDG_DATA_HOME/cortexfs/storage/current`` that user has."""
    a = fresh_root(_template, place / "a")
    home = place / "home"
    home.mkdir()
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    xdg = home / "xdg"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_DATA_HOME": str(xdg)}

    mine = run_as(unprivileged_user, [*CTX_ARGV, "bootstrap"],
                  env={**env, "CTX_STORAGE": "mine/"}, cwd=home)  # fmt: skip
    assert mine.returncode == 0, mine
    assert mine.stdout.splitlines()[0] == f"storage root: {home / 'mine'}", mine
    assert not xdg.exists()

    before_a = snapshot(a)
    refused = run_as(
        unprivileged_user,
        [*CTX_ARGV, "queue", "publish", "--project", "proj", "-"],
        env={**env, "CTX_STORAGE": str(a)}, stdin=job("u"),
    )  # fmt: skip
    assert refused.returncode == 1 and "EACCES" in refused.stderr, refused
    assert f"{a}/shared/proj" in refused.stderr, refused
    assert f"yours is {xdg}/cortexfs/storage/current" in refused.stderr, refused
    assert str(home / "mine") not in refused.stderr
    assert snapshot(a) == before_a

    own = run_as(unprivileged_user, [*CTX_ARGV, "--storage", "mine", "queue", "init",
                                     "--project", "proj"], env={**env, "CTX_STORAGE": str(a)},
                 cwd=home)  # fmt: skip
    assert own.returncode == 0, own
    assert str(home / "mine" / "shared/proj/queue") in own.stdout, own
    assert snapshot(a) == before_a
