"""The same state gives the same answer, whatever happens around the command that reads it.

Every reader of the command line — ``ctx queue status|list|show|recover --dry-run``, ``ctx
session show|tail|list``, ``ctx policy explain|check|query``, ``ctx object list|which``, ``ctx
agent list|show``, ``ctx man``, and the reports of ``ctx bootstrap``, ``ctx shared create`` and
``ctx queue init`` run again over what they made — is run under other ``PYTHONHASHSEED``
values, time zones (``TZ``), locales (``LC_ALL``/``LANG``), ``COLUMNS``/``LINES``, terminal
widths, ``PYTHONOPTIMIZE``, from other working directories (one that no longer exists among
them), with the storage root and the queue named in each way the docs allow, and on two roots
whose directories got the same entries in other orders (on a tmpfs, whose listings follow the
order of creation).  Text and ``--json`` answers must be byte for byte the same where nothing
in the state differs; every time printed is UTC, as docs/sessions.md and docs/queue.md say
(none is printed in local time); the orders are the documented ones: claims and ``list
--state pending`` oldest publish time first, then the job's name (Q-9), CTX_PATH spaces and
hooks in name order (docs/tools.md), policy lines in any order deciding alike
(docs/policy.md).  A log line, too, is the same for one call whatever the hash seed (S-4)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import pwd
import re
import select
import shutil
import struct
import subprocess
import tempfile
import termios
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    request,
    result,
    scratch_top,
    tool_manifest,
)
from tests.support.storage import copy_of_root, small_tmpfs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: agents run as nobody, and a tmpfs is mounted"
)

NOBODY = pwd.getpwnam("nobody")
T0 = 1_750_000_000  # 2025-06-15T15:06:40Z: the publish times of hand-made jobs
SPACES = ("zeta", "alpha", "Mid")
# The environment settings that must change no answer: each line is one run.
_BASE_DROPPED = (
    "LC_",
    "LANG",
    "TZ",
    "PYTHONHASHSEED",
    "PYTHONOPTIMIZE",
    "COLUMNS",
    "LINES",
    "TERM",
    "NO_COLOR",
)


def _english_locale() -> str:
    """en_US.UTF-8 where it is installed, else C.UTF-8 (what a minimal image has)."""
    listed = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False)
    names = {name.lower().replace("-", "") for name in listed.stdout.split()}
    return "en_US.UTF-8" if "en_us.utf8" in names else "C.UTF-8"


VARIANTS: tuple[dict[str, str], ...] = (
    {
        "PYTHONHASHSEED": "0",
        "TZ": "Pacific/Kiritimati",
        "LC_ALL": "C",
        "COLUMNS": "20",
        "LINES": "2",
        "TERM": "dumb",
    },
    {
        "PYTHONHASHSEED": "4242",
        "TZ": "America/St_Johns",
        "LANG": _english_locale(),
        "COLUMNS": "300",
        "NO_COLOR": "1",
    },
)


def base_env(storage: Path | str | None = None, **extra: str) -> dict[str, str]:
    """The caller's environment without a locale, zone, hash seed or width setting (and no
    CortexFS setting), on ``storage``, plus ``extra``."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(_BASE_DROPPED)}
    if storage is not None:
        env["CTX_STORAGE"] = str(storage)
    env.update(extra)
    return env


def answer(run: Run) -> tuple[int, str, str]:
    return run.rc, run.out, run.err


def same_everywhere(
    storage: Path, commands: Sequence[Sequence[str]], cwds: Sequence[Path] = (Path("/"),)
) -> list[Run]:
    """Each command run once plainly from ``/``, then under each of :data:`VARIANTS`, each
    variant from the next of ``cwds``; every run must answer byte for byte as the first.
    Returns the first runs."""
    first = [ctx_run(*command, env=base_env(storage), cwd=Path("/")) for command in commands]
    for n, extra in enumerate(VARIANTS):
        cwd = cwds[n % len(cwds)]
        for command, plain in zip(commands, first, strict=True):
            again = ctx_run(*command, env=base_env(storage, **extra), cwd=cwd)
            assert answer(again) == answer(plain), (extra, str(cwd), again, plain)
    return first


# ---------------------------------------------------------------------------- the world


@dataclass
class World(OnStorage):
    """A storage root holding three spaces, tools in three tiers, three agents, sessions in
    a home and a space, and a queue in every state: only ever read."""

    storage: Path
    top: Path
    workspace: Path

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")


def _lease(job: str, expires: str = "2000-01-01T00:00:00Z") -> str:
    return json.dumps(
        {
            "job": job,
            "worker": "elsewhere:7",
            "host": "elsewhere",
            "boot_id": "0-0",
            "pid_ns": 1,
            "pid": 4242,
            "create_time": 1.0,
            "claimed_at": "2000-01-01T00:00:00Z",
            "expires_at": expires,
        }
    )


def build_world(top: Path, template: Path) -> World:
    world = World(copy_of_root(template, top / "storage"), top, top / "ws")
    world.workspace.mkdir(mode=0o755)
    (world.workspace / "a.txt").write_text("data\n")
    for space in SPACES:
        made = world.ctx("shared", "create", space, "--group", str(NOBODY.pw_gid))
        assert made.rc == 0, made
    for name, tiers in (
        ("aa.tool", ("user", "shared:alpha")),
        ("Mm.tool", ("shared:zeta", "user")),
    ):
        manifest = tool_manifest(top / "manifests", name, "#!/bin/sh\ncat\n")
        (top / "manifests" / f"{name}.sh").chmod(0o755)
        for tier in tiers:
            done = world.ctx("object", "install", manifest, "--tier", tier)
            assert done.rc == 0, done
    world.create_agent(
        {
            "name": "coder",
            "label": "coder_t",
            "tools": ["fs.stat", "aa.tool"],
            "shared": {"zeta": ["read"], "alpha": ["read", "write"], "Mid": ["read"]},
            "mount": [[str(world.workspace), "/workspace", "rw"]],
        }
    )
    world.create_agent({"name": "bob", "label": "bob_t", "tools": ["fs.stat"]})
    world.create_agent({"name": "Alice", "label": "alice_t"})
    world.allow_tool("coder_t", "fs.stat")
    for where in (["--session", "default"], ["--session", "s2"], ["--project", "alpha"]):
        ran = world.ctx("run", "--agent", "coder", *where, "fs.stat", "/workspace/a.txt")
        assert ran.rc == 0, ran
    # The queue: two finished jobs, one held by pid 1, two pending, and by hand a claim
    # without its lease, a lease without its claim, a conflict and three entries not jobs.
    q = world.queue
    for n, name in enumerate(("b-2", "A0", "zz", "m.m", "Z-z")):
        job = q.drop(name, request(tag=name))
        os.utime(q.dir / "pending" / job, (T0 + n, T0 + n))
    assert q.claim() == "b-2.req.json"
    q.finish("b-2.req.json")
    assert q.claim() == "A0.req.json"
    q.finish("A0.req.json", "--error")
    assert q.claim("--pid", "1", "--ttl", "86400") == "zz.req.json"
    (q.dir / "claimed" / "cl.req.json").mkdir()
    (q.dir / "claimed" / "cl.req.json" / "cl.req.json").write_text(json.dumps(request()))
    (q.dir / "lease" / "le.req.json").mkdir()
    (q.dir / "lease" / "le.req.json" / "worker").write_text(_lease("le.req.json"))
    q.drop("cf")
    os.utime(q.dir / "pending" / "cf.req.json", (T0 + 9, T0 + 9))
    q.terminal("cf")
    (q.dir / "pending" / ".hidden").write_text("x")
    os.symlink("/etc/hostname", q.dir / "pending" / "link.req.json")
    (q.dir / "failed" / "junk").write_text("x")
    return world


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__), "world-")
    try:
        yield build_world(top, _template)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def cwds_of(world: World) -> list[Path]:
    return [world.storage, world.workspace, Path("/tmp")]


# ---------------------------------------------------------------------------- readers


def test_queue_status_and_list_answer_alike_under_every_environment(world: World) -> None:
    """§2.4, Q-6, Q-8: status and list, text and JSON, are the same bytes under other hash
    seeds, zones, locales, widths and working directories; status counts what is there and
    names the conflict (exit 1), ignored entries come state by state, then by path."""
    p = ["--project", "proj"]
    status, status_json, listed, listed_json, pending, incomplete, conflict = same_everywhere(
        world.storage,
        [
            ["queue", "status", *p],
            ["queue", "status", *p, "--json"],
            ["queue", "list", *p],
            ["queue", "list", *p, "--json"],
            ["queue", "list", *p, "--state", "pending"],
            ["queue", "list", *p, "--state", "incomplete"],
            ["queue", "list", *p, "--state", "conflict", "--json"],
        ],
        cwds_of(world),
    )
    assert status.rc == 1 and status_json.rc == 1, status
    counts = status_json.json()["counts"]
    assert counts == {
        "pending": 2,
        "claimed": 1,
        "done": 1,
        "failed": 1,
        "incomplete": 2,
        "conflict": 1,
        "ignored": 3,
    }, status_json
    ignored = [i["path"] for i in status_json.json()["ignored"]]
    assert ignored == ["pending/.hidden", "pending/link.req.json", "failed/junk"], status_json
    assert [i["job"] for i in status_json.json()["incomplete"]] == ["cl.req.json", "le.req.json"]
    names = [line.split()[1] for line in listed.lines()]
    assert names == sorted(names, key=os.fsencode) and len(names) == 8, listed
    assert [j["name"] for j in listed_json.json()] == names, listed_json
    assert pending.lines() == ["m.m.req.json", "Z-z.req.json"], pending
    assert incomplete.lines() == ["cl.req.json", "le.req.json"], incomplete
    assert [j["name"] for j in conflict.json()] == ["cf.req.json"], conflict


def test_queue_show_and_recover_dry_run_answer_alike_under_every_environment(
    world: World,
) -> None:
    """§2.4, Q-5, Q-6: show (text, JSON) of a held job, a finished one and a conflict, and
    recover --dry-run, plain and --reconcile, are the same bytes everywhere; every time shown
    is UTC (``…Z``), never the reader's local time."""
    p = ["--project", "proj"]
    held, held_json, done, conflict, dry, dry_json = same_everywhere(
        world.storage,
        [
            ["queue", "show", *p, "zz"],
            ["queue", "show", *p, "zz", "--json"],
            ["queue", "show", *p, "b-2"],
            ["queue", "show", *p, "cf", "--json"],
            ["queue", "recover", *p, "--dry-run"],
            ["queue", "recover", *p, "--reconcile", "--dry-run", "--json"],
        ],
        cwds_of(world),
    )
    assert held.rc == 0 and held.lines()[-1].startswith("holder: alive"), held
    shown = held_json.json()
    assert shown["holder"]["state"] == "alive" and shown["lease"]["pid"] == 1, held_json
    for stamp in [e["mtime"] for e in shown["evidence"]] + [
        shown["lease"]["claimed_at"],
        shown["lease"]["expires_at"],
    ]:
        assert stamp.endswith("Z"), held_json
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", held.out), held
    assert done.rc == 0 and "done" in done.lines()[1], done
    assert conflict.rc == 1 and conflict.json()["state"] == "conflict", conflict
    assert dry.rc == 1 and dry_json.rc == 1, dry


def test_session_readers_answer_alike_under_every_environment(world: World) -> None:
    """S-1, S-2, docs/sessions.md: show, tail and list (text and JSON Lines) of a home and a
    space's session are the same bytes everywhere; the time column is the event's own UTC
    ``ts`` whatever TZ says, and list names sessions in name order."""
    shown, shown_json, tail, listed, listed_json, team = same_everywhere(
        world.storage,
        [
            ["session", "show", "coder"],
            ["session", "show", "coder", "--json"],
            ["session", "tail", "coder", "s2", "-n", "1"],
            ["session", "list", "coder"],
            ["session", "list", "coder", "--json"],
            ["session", "show", "coder", "default", "--project", "alpha"],
        ],
        cwds_of(world),
    )
    events = [json.loads(line) for line in shown_json.lines()]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], shown_json
    assert [line.split()[0] for line in shown.lines()] == [e["ts"] for e in events], shown
    assert all(e["ts"].endswith("Z") for e in events), shown_json
    assert len(tail.lines()) == 1 and tail.lines()[0].split()[1] == "tool_result", tail
    assert listed.lines() == ["default", "s2"], listed
    assert [s["name"] for s in listed_json.json()] == ["default", "s2"], listed_json
    assert team.rc == 0 and len(team.lines()) == 2, team


def test_policy_explain_answers_alike_under_every_environment(world: World) -> None:
    """P-5, P-8: explain walks the six steps in their order, text and JSON the same bytes
    everywhere, for an allow and for a denial."""
    allowed, allowed_json, denied, write = same_everywhere(
        world.storage,
        [
            ["policy", "explain", "coder", "tool:fs.stat", "execute"],
            ["policy", "explain", "coder", "tool:fs.stat", "execute", "--json"],
            ["policy", "explain", "coder", "tool:aa.tool", "execute"],
            ["policy", "explain", "coder", "shared:alpha", "write", "--json"],
        ],
        cwds_of(world),
    )
    assert allowed.rc == 0 and allowed.lines()[-1] == "allow", allowed
    assert [s["step"] for s in allowed_json.json()["steps"]] == [1, 2, 3, 4, 5, 6]
    assert denied.rc == 1 and denied.lines()[-1].startswith("deny"), denied
    assert write.rc == 0 and write.json()["allowed"] is True, write


def test_object_readers_answer_alike_under_every_environment(world: World) -> None:
    """T-8a, T-4: object list (every tier, one tier, JSON) and object which are the same
    bytes everywhere; the tiers come system, user, then the spaces in name order, and the
    tools of a tier in name order."""
    listed, listed_json, user, which, which_json = same_everywhere(
        world.storage,
        [
            ["object", "list"],
            ["object", "list", "--json"],
            ["object", "list", "--tier", "user"],
            ["object", "which", "aa.tool"],
            ["object", "which", "fs.stat", "--json"],
        ],
        cwds_of(world),
    )
    rows = [(o["tier"], o["name"]) for o in listed_json.json()]
    tiers = list(dict.fromkeys(tier for tier, _ in rows))
    assert tiers == ["system", "user", "shared:alpha", "shared:zeta"], listed_json
    for tier in tiers:
        names = [name for t, name in rows if t == tier]
        assert names == sorted(names, key=os.fsencode), (tier, names)
    assert [line.split()[:2] for line in listed.lines()] == [[n, t] for t, n in rows], listed
    assert [line.split()[0] for line in user.lines()] == ["Mm.tool", "aa.tool"], user
    assert which.out == f"{world.storage}/home/0/tool/aa.tool\n", which
    assert which_json.json()["path"] == f"{world.storage}/tool/fs.stat", which_json


def test_agent_readers_answer_alike_under_every_environment(world: World) -> None:
    """A-3, T-4: agent list (text, JSON) in name order and agent show (text, JSON) are the
    same bytes everywhere; the agent's CTX_PATH names its spaces in name order."""
    listed, listed_json, shown, shown_json = same_everywhere(
        world.storage,
        [
            ["agent", "list"],
            ["agent", "list", "--json"],
            ["agent", "show", "coder"],
            ["agent", "show", "coder", "--json"],
        ],
        cwds_of(world),
    )
    assert [line.split()[0] for line in listed.lines()] == ["Alice", "bob", "coder"], listed
    assert [a["name"] for a in listed_json.json()] == ["Alice", "bob", "coder"], listed_json
    spaces = [f"/ctx/shared/{s}/tool" for s in sorted(SPACES, key=os.fsencode)]
    path = ":".join(["/ctx/tool", f"/ctx/home/{NOBODY.pw_uid}/tool", *spaces])
    assert shown_json.json()["ctx_path"] == path, shown_json
    assert f"ctx_path: {path}" in shown.lines(), shown


def test_man_and_rerun_reports_answer_alike_under_every_environment(world: World) -> None:
    """D-1, X-1, §2.4: the manual's topic list, and shared create and queue init run again
    over what they made, say the same bytes everywhere: nothing to do."""
    topics, space, space_json, init = same_everywhere(
        world.storage,
        [
            ["man"],
            ["shared", "create", "alpha"],
            ["shared", "create", "zeta", "--json"],
            ["queue", "init", "--project", "proj", "--json"],
        ],
        cwds_of(world),
    )
    assert [line.split()[0] for line in topics.lines()] == [
        "README",
        "agent",
        "tool",
        "model",
        "coreutils",
        "root-abi",
        "session",
        "provider",
    ], topics
    assert (
        space.rc == 0 and space.out == f"nothing to do: {world.storage}/shared/alpha is complete\n"
    )
    made = space_json.json()
    assert (made["created"], made["regrouped"], made["repaired"]) == ([], 0, []), space_json
    assert init.json() == {"queue": str(world.queue.dir), "created": []}, init


def _on_terminal(argv: list[str], env: dict[str, str], columns: int) -> bytes:
    """What ``ctx ARGV`` shows on a pseudo-terminal ``columns`` wide (CR LF made LF)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        [*CTX_ARGV, *argv],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            shown += chunk
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return bytes(shown).replace(b"\r\n", b"\n")


def test_readers_on_narrow_and_wide_terminals_show_what_a_pipe_gets(world: World) -> None:
    """§2.4: on a terminal 20 or 300 columns wide, tables are neither cut nor wrapped by
    ctx: object list, queue show, session show and agent show are the pipe's bytes."""
    env = base_env(world.storage)
    for argv in (
        ["object", "list"],
        ["queue", "show", "--project", "proj", "zz"],
        ["session", "show", "coder"],
        ["agent", "show", "coder"],
    ):
        piped = subprocess.run([*CTX_ARGV, *argv], capture_output=True, env=env).stdout
        assert piped, argv
        for columns in (20, 300):
            assert _on_terminal(argv, env, columns) == piped, (argv, columns)


def test_readers_under_pythonoptimize_answer_as_without_it(world: World) -> None:
    """§2.4, P-8, A-3: with Python's optimisations on (``PYTHONOPTIMIZE=2``: no assert
    statements, no docstrings) the readers give the same bytes."""
    commands = [
        ["queue", "status", "--project", "proj", "--json"],
        ["agent", "show", "coder"],
        ["policy", "explain", "coder", "tool:aa.tool", "execute"],
    ]
    for command in commands:
        plain = ctx_run(*command, env=base_env(world.storage))
        optimised = ctx_run(
            *command,
            env=base_env(world.storage, PYTHONOPTIMIZE="2", PYTHONDONTWRITEBYTECODE="1"),
        )
        assert plain.out and answer(optimised) == answer(plain), (optimised, plain)


# ---------------------------------------------------------------- names of the same thing


def test_storage_named_every_way_gives_the_same_answers(world: World) -> None:
    """R-1, docs/queue.md: --storage relative from two directories, with ``..`` and a
    trailing slash, and $CTX_STORAGE relative, give what the absolute path gives: every path
    printed is absolute."""
    root = world.storage
    commands = [
        ["queue", "status", "--project", "proj", "--json"],
        ["object", "which", "fs.stat"],
        ["session", "list", "coder", "--json"],
        ["agent", "show", "coder", "--json"],
    ]
    env = base_env()
    named = [
        (root.parent, root.name),
        (root / "shared", "../"),
        (world.workspace, f"../{root.name}/./tool/.."),
    ]
    for command in commands:
        first = ctx_run(*command, "--storage", str(root), env=env, cwd=Path("/"))
        assert str(root) in first.out, first
        for cwd, spelt in named:
            again = ctx_run(*command, "--storage", spelt, env=env, cwd=cwd)
            assert answer(again) == answer(first), (spelt, again, first)
        from_env = ctx_run(*command, env=base_env(root.name), cwd=root.parent)
        assert answer(from_env) == answer(first), from_env


def test_queue_named_every_way_gives_the_same_answers(world: World) -> None:
    """§2.4, docs/queue.md: --project P, $CTX_PROJECT, --project with the queue's absolute
    path, --queue relative, --project ./queue typed in the space and ../queue typed in its
    data/ name one queue, and status, list and show answer alike."""
    root, q = world.storage, world.queue.dir
    ways = [
        (Path("/"), ["--project", "proj"], {}),
        (Path("/"), [], {"CTX_PROJECT": "proj"}),
        (Path("/"), ["--project", f"{q}/"], {}),
        (root, ["--queue", "shared/proj/queue"], {}),
        (root / "shared" / "proj", ["--project", "./queue"], {}),
        (root / "shared" / "proj" / "data", ["--project", "../queue"], {}),
    ]
    for verb in (["status", "--json"], ["list"], ["show", "zz", "--json"]):
        answers = set()
        for cwd, named, extra in ways:
            run = ctx_run("queue", *verb, *named, env=base_env(root, **extra), cwd=cwd)
            assert run.rc in (0, 1) and run.out, (named, run)
            answers.add(answer(run))
        assert len(answers) == 1, (verb, answers)


def test_ctx_path_relative_entries_are_ignored_from_any_directory(world: World) -> None:
    """T-4, docs/tools.md: empty and relative CTX_PATH entries are ignored: from a directory
    where ``tool/fs.stat`` exists relatively, as from any other, which finds the root's."""
    decoy = world.top / "decoy"
    (decoy / "tool").mkdir(parents=True, exist_ok=True)
    (decoy / "tool" / "fs.stat").write_text("#!/bin/sh\n")
    (decoy / "tool" / "fs.stat").chmod(0o755)
    path = "tool:./tool::/ctx/home/0/tool:/ctx/tool"
    answers = set()
    for cwd in (Path("/"), decoy, world.storage):
        run = ctx_run(
            "object",
            "which",
            "fs.stat",
            "--json",
            env=base_env(world.storage, CTX_PATH=path),
            cwd=cwd,
        )
        assert run.rc == 0 and run.json()["path"] == f"{world.storage}/tool/fs.stat", run
        answers.add(answer(run))
    assert len(answers) == 1, answers


# -------------------------------------------------------------- working directory gone


def run_in_vanished_directory(directory: Path, *args: str, env: dict[str, str]) -> Run:
    """``ctx ARGS`` started in ``directory``, which is removed before ctx runs."""
    directory.mkdir()
    proc = subprocess.run(
        [*CTX_ARGV, *args],
        cwd=directory,
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        preexec_fn=lambda: os.rmdir(directory),
    )
    assert not directory.exists()
    return Run(list(args), proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_readers_in_a_directory_that_no_longer_exists_answer_as_anywhere(world: World) -> None:
    """R-1: with an absolute storage root, a working directory removed under the command
    changes no reader's answer."""
    commands = [
        ["queue", "status", "--project", "proj"],
        ["queue", "show", "--project", "proj", "zz"],
        ["object", "list"],
        ["agent", "show", "coder"],
        ["session", "show", "coder"],
        ["policy", "explain", "coder", "tool:fs.stat", "execute"],
    ]
    for n, command in enumerate(commands):
        here = ctx_run(*command, env=base_env(world.storage), cwd=Path("/"))
        gone = run_in_vanished_directory(
            world.top / f"gone{n}", *command, env=base_env(world.storage)
        )
        assert answer(gone) == answer(here), (gone, here)


def test_relative_storage_in_a_directory_that_no_longer_exists_says_so(world: World) -> None:
    """R-1: a relative --storage or $CTX_STORAGE where the working directory is gone is
    ENOENT naming the value and the reason, nothing read."""
    gone = run_in_vanished_directory(
        world.top / "gone-s",
        "queue",
        "status",
        "--project",
        "proj",
        "--storage",
        "my-root-dir",
        env=base_env(),
    )
    assert gone.rc == 1 and gone.out == "", gone
    assert gone.err.startswith("ctx: ENOENT: --storage my-root-dir is relative"), gone
    assert "current directory no longer exists" in gone.err, gone
    gone = run_in_vanished_directory(
        world.top / "gone-e", "object", "list", env=base_env("my-root-dir")
    )
    assert gone.rc == 1 and gone.out == "", gone
    assert gone.err.startswith("ctx: ENOENT: CTX_STORAGE my-root-dir is relative"), gone


def test_relative_queue_in_a_directory_that_no_longer_exists_is_named(world: World) -> None:
    env = base_env(world.storage)
    for n, verb in enumerate((["status"], ["list", "--json"], ["show", "j"], ["claim"])):
        gone = run_in_vanished_directory(
            world.top / f"gone-q{n}", "queue", *verb, "--queue", "my-queue-dir", env=env
        )
        assert gone.rc in (1, 2) and "ENOENT" in gone.err, gone
        assert "my-queue-dir" in gone.err, gone


# ------------------------------------------------------------------------- orders


def test_pending_jobs_are_listed_and_claimed_by_publish_time_then_name(queue: QueueCLI) -> None:
    """Q-9, docs/queue.md: list --state pending names the jobs in the order claims take
    them: oldest publish time first, the whole job name (byte order) breaking ties; the
    same under every environment."""
    ties = ["a", "a-b", "a.b", "a0", "a_", "A", "a.req"]
    for name, when in [("e", T0 - 10), *((n, T0) for n in ties), ("d", T0 + 10)]:
        job = queue.drop(name)
        os.utime(queue.dir / "pending" / job, (when, when))
    expected = [
        "e.req.json",
        *sorted((f"{n}.req.json" for n in ties), key=os.fsencode),
        "d.req.json",
    ]
    assert expected[1:4] == ["A.req.json", "a-b.req.json", "a.b.req.json"]
    (listed,) = same_everywhere(
        queue.storage, [["queue", "list", "--project", "proj", "--state", "pending"]]
    )
    assert listed.lines() == expected, listed
    claimed = [queue.claim("--pid", "1", "--ttl", "3600") for _ in expected]
    assert claimed == expected


def test_policy_lines_in_any_order_explain_the_same(searchable_storage: Path) -> None:
    """docs/policy.md ("the order of lines never matters"), P-1, P-5: the agent's policy
    rewritten with its rules shuffled, doubled, commented and spaced explains every request
    in the same bytes."""
    on = OnStorage()
    on.storage = searchable_storage
    on.create_agent(
        {
            "name": "coder",
            "label": "coder_t",
            "tools": ["fs.stat", "fs.read"],
            "shared": {"proj": ["read", "write"]},
        }
    )
    on.allow_tool("coder_t", "fs.stat", "fs.read")
    asked = [
        ["policy", "explain", "coder", "tool:fs.stat", "execute"],
        ["policy", "explain", "coder", "tool:fs.read", "execute", "--json"],
        ["policy", "explain", "coder", "tool:fs.write", "execute"],
        ["policy", "explain", "coder", "shared:proj", "write", "--json"],
    ]
    before = [on.ctx(*a) for a in asked]
    assert [r.rc for r in before] == [0, 0, 1, 1], before
    policy = searchable_storage / "agent" / "coder.d" / "policy"
    rules = [line for line in policy.read_text().splitlines() if line.startswith("allow")]
    shuffled = [*rules[::-1], "", "# again, in another order", *sorted(rules), "   "]
    policy.write_text("\n".join(shuffled) + "\n")
    after = [on.ctx(*a) for a in asked]
    for was, now in zip(before, after, strict=True):
        assert answer(now) == answer(was), (now, was)


def test_policy_check_and_query_report_in_file_and_argument_order(tmp_path: Path) -> None:
    """P-8, docs/policy.md: check reports every invalid line in line order, text and JSON the
    same under every hash seed; query --json lists the policies in the order given."""
    bad = tmp_path / "bad"
    bad.write_text(
        "allow a_t tool:x execute\nallow a_t bogus:y z\n\nallow a_t agent:* create\n"
        "deny a_t tool:x execute\nallow a_t tool:x read\n"
    )
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_text("allow a_t tool:x execute\n")
    two.write_text("# two\nallow a_t tool:x execute\nallow a_t tool:y execute\n")
    checked, checked_json, query, query_back = same_everywhere(
        tmp_path,
        [
            ["policy", "check", str(bad)],
            ["policy", "check", str(bad), "--json"],
            [
                "policy",
                "query",
                "--policy",
                str(two),
                "--policy",
                str(one),
                "a_t",
                "tool:x",
                "execute",
                "--json",
            ],
            [
                "policy",
                "query",
                "--policy",
                str(one),
                "--policy",
                str(two),
                "a_t",
                "tool:x",
                "execute",
                "--json",
            ],
        ],
    )
    assert checked.rc == 1, checked
    lines = [int(line.split(":")[1]) for line in checked.err.splitlines()]
    assert lines == [2, 4, 5, 6], checked
    problems = checked_json.json()["files"][0]["problems"]
    assert [p["line"] for p in problems] == [2, 4, 5, 6], checked_json
    assert [p["policy"] for p in query.json()["policies"]] == [str(two), str(one)], query
    assert [p["policy"] for p in query_back.json()["policies"]] == [str(one), str(two)]
    assert query.json()["decision"] == query_back.json()["decision"] == "allow", query


def test_identity_groups_in_any_order_read_the_same(storage: Path) -> None:
    """A-3, docs/policy.md (identity): an identity whose groups are listed in another order
    is the same identity: agent list and show print the groups in one order."""
    on = OnStorage()
    on.storage = storage
    for name in ("first", "second"):
        on.create_agent({"name": name, "label": "same_t"})
    groups = [2000, 3, NOBODY.pw_gid, 1000, 70000, 7]
    for name, order in (("first", groups), ("second", groups[::-1])):
        identity = {"uid": NOBODY.pw_uid, "gid": NOBODY.pw_gid, "groups": order}
        (storage / "agent" / f"{name}.d" / "identity").write_text(json.dumps(identity))
    listed = on.ctx("agent", "list", "--json")
    assert listed.rc == 0, listed
    first, second = (a["identity"] for a in listed.json())
    assert first == second and first["groups"] == sorted(groups), listed
    shown = [on.ctx("agent", "show", name) for name in ("first", "second")]
    assert [r.out.replace("second", "first") for r in shown] == [shown[0].out] * 2, shown
    in_order = ",".join(str(g) for g in sorted(groups))
    assert f"groups {in_order}" in shown[0].out, shown[0]


def test_agent_requests_in_other_orders_make_agents_that_read_the_same(
    searchable_storage: Path,
) -> None:
    """A-3, T-4, docs/policy.md: two agents made from the same request with its tools,
    spaces and permissions listed in other orders show the same CTX_PATH, mounts and
    decisions."""
    on = OnStorage()
    on.storage = searchable_storage
    for space in SPACES:
        made = on.ctx("shared", "create", space, "--group", str(NOBODY.pw_gid))
        assert made.rc == 0, made
    on.create_agent(
        {
            "name": "agent-one",
            "label": "one_t",
            "tools": ["fs.stat", "fs.read"],
            "shared": {"zeta": ["write", "read"], "alpha": ["read"], "Mid": ["read", "write"]},
        }
    )
    on.create_agent(
        {
            "name": "agent-two",
            "label": "two_t",
            "tools": ["fs.read", "fs.stat"],
            "shared": {"Mid": ["write", "read"], "alpha": ["read"], "zeta": ["read", "write"]},
        }
    )

    def seen(name: str) -> list[str]:
        asked = [
            ["agent", "show", name],
            ["agent", "show", name, "--json"],
            ["policy", "explain", name, "shared:zeta", "write"],
            ["policy", "explain", name, "shared:alpha", "write", "--json"],
        ]
        return [
            on.ctx(*a).out.replace("agent-two", "agent-one").replace("two_t", "one_t")
            for a in asked
        ]

    one, two = seen("agent-one"), seen("agent-two")
    assert one == two
    assert "/ctx/shared/Mid/tool:/ctx/shared/alpha/tool:/ctx/shared/zeta/tool" in one[0], one


# ------------------------------------------------------------ entries made in other orders


@pytest.fixture(scope="module")
def ordered_fs() -> Iterator[Path]:
    """A tmpfs: its directories list their entries in the order they were made (newest
    first), not in an order of their names, as ext4 and xfs do."""
    top = new_scratch_dir(scratch_top(__file__), "tmpfs-")
    try:
        with small_tmpfs(top / "fs", "256m", 0o755) as fs:
            yield fs
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def place(ordered_fs: Path) -> Iterator[Path]:
    made = Path(tempfile.mkdtemp(prefix="p", dir=ordered_fs))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def built_in_two_orders(
    template: Path, place: Path, build: Callable[[Path, bool], None]
) -> tuple[Path, list[Path]]:
    """Two roots, each copied from ``template`` at ``place/storage`` and made there by
    ``build(root, reverse)`` (``reverse`` False, then True), then moved aside: the path they
    are read at, and the two."""
    where = place / "storage"
    made = []
    for reverse in (False, True):
        copy_of_root(template, where)
        build(where, reverse)
        kept = place / f"built-{int(reverse)}"
        where.rename(kept)
        made.append(kept)
    return where, made


def read_each(
    where: Path, roots: list[Path], commands: Sequence[Sequence[str]], fix=lambda s: s
) -> list[list[tuple[int, str, str]]]:
    """Each root moved to ``where`` in turn and ``commands`` run on it there: their answers
    (``fix`` applied to both outputs)."""
    answers = []
    for root in roots:
        root.rename(where)
        try:
            runs = [ctx_run(*c, env=base_env(where), cwd=Path("/")) for c in commands]
        finally:
            where.rename(root)
        answers.append([(r.rc, fix(r.out), fix(r.err)) for r in runs])
    return answers


def listed_in_other_orders(roots: list[Path], relative: str) -> None:
    """The precondition of a comparison: the two copies of ``relative`` list their entries
    in other orders (else the filesystem sorts them, and the test shows nothing)."""
    orders = [os.listdir(root / relative) for root in roots]
    if orders[0] == orders[1]:
        pytest.skip(f"this filesystem lists {relative} in one order however it was made")


def stamp_tree(top: Path) -> None:
    """Every entry below ``top``, and ``top``, dated :data:`T0`."""
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (T0, T0), follow_symlinks=False)
    os.utime(top, (T0, T0))


REQUEST = json.dumps(request())
RESULT = json.dumps(result())


def queue_evidence(q: Path) -> list[tuple[str, Path, str | None]]:
    """The entries (kind, path, content or link target) of a queue holding each kind of
    evidence, in the order they are made."""
    made: list[tuple[str, Path, str | None]] = []
    for name in ("b-2", "B_1", "a.9", "A0", "zz", "Z-z", "m.m", "0x", "9_"):
        made.append(("file", q / "pending" / f"{name}.req.json", REQUEST))
    for state, names in (("done", ("d2", "D1", "d_3")), ("failed", ("f2", "F1"))):
        for name in names:
            made += [
                ("file", q / state / f"{name}.req.json", REQUEST),
                ("file", q / state / f"{name}.req.json.result", RESULT),
            ]
    for name in ("cl2", "Cl1"):  # claims without leases
        made += [
            ("dir", q / "claimed" / f"{name}.req.json", None),
            ("file", q / "claimed" / f"{name}.req.json" / f"{name}.req.json", REQUEST),
        ]
    for name in ("le2", "Le1"):  # leases without claims
        made += [
            ("dir", q / "lease" / f"{name}.req.json", None),
            ("file", q / "lease" / f"{name}.req.json" / "worker", _lease(f"{name}.req.json")),
        ]
    for name in ("hl2", "Hl1"):  # claimed and leased by a holder on another host
        job = f"{name}.req.json"
        made += [
            ("dir", q / "claimed" / job, None),
            ("file", q / "claimed" / job / job, REQUEST),
            ("dir", q / "lease" / job, None),
            ("file", q / "lease" / job / "worker", _lease(job, "2999-01-01T00:00:00Z")),
        ]
    made.append(("file", q / "done" / "lonely.req.json.result", RESULT))
    for name in ("cf2", "Cf1"):  # both pending and done
        made += [
            ("file", q / "pending" / f"{name}.req.json", REQUEST),
            ("file", q / "done" / f"{name}.req.json", REQUEST),
            ("file", q / "done" / f"{name}.req.json.result", RESULT),
        ]
    for path in (
        "pending/.hidden",
        "pending/bad name.req.json",
        "pending/README",
        "done/.x",
        "failed/junk",
    ):
        made.append(("file", q / path, "x"))
    made += [
        ("link", q / "pending" / "ln.req.json", "/etc/passwd"),
        ("link", q / "pending" / "Aln.req.json", "/etc/hostname"),
    ]
    for name in (".publish-b.tmp", ".publish-a.tmp", "zz.tmp"):
        made.append(("file", q / "inbox" / name, "partial"))
    return made


def make_entries(entries: list[tuple[str, Path, str | None]], reverse: bool) -> None:
    ordered = entries[::-1] if reverse else entries
    for kind, path, data in [e for e in ordered if e[0] == "dir"] + [
        e for e in ordered if e[0] != "dir"
    ]:
        if kind == "dir":
            path.mkdir()
        elif kind == "link":
            os.symlink(str(data), path)
        else:
            path.write_text(str(data))


def test_queue_evidence_made_in_two_orders_reads_the_same(_template: Path, place: Path) -> None:
    """Q-6, Q-8, §2.4: a queue whose pending, claimed, lease, done, failed and inbox entries
    were made in other orders (same names, contents and times) gets the same status, list,
    show and recover --dry-run answers, text and JSON (inode numbers and ages aside)."""

    def build(root: Path, reverse: bool) -> None:
        q = root / "shared" / "proj" / "queue"
        make_entries(queue_evidence(q), reverse)
        stamp_tree(q)

    where, roots = built_in_two_orders(_template, place, build)
    listed_in_other_orders(roots, "shared/proj/queue/pending")
    p = ["--project", "proj"]
    commands = [
        ["queue", "status", *p],
        ["queue", "status", *p, "--json"],
        ["queue", "list", *p],
        ["queue", "list", *p, "--json"],
        ["queue", "list", *p, "--state", "pending"],
        ["queue", "list", *p, "--state", "incomplete"],
        ["queue", "list", *p, "--state", "conflict", "--json"],
        ["queue", "show", *p, "Cf1"],
        ["queue", "show", *p, "Hl1", "--json"],
        ["queue", "recover", *p, "--dry-run", "--json"],
        ["queue", "recover", *p, "--reconcile", "--dry-run"],
    ]

    def fix(text: str) -> str:
        text = re.sub(r'"inode": \d+', '"inode": 0', text)
        text = re.sub(r'"age_seconds": [0-9.]+', '"age_seconds": 0', text)
        return re.sub(r"\(\d+s old\)", "(N s old)", text)

    first, second = read_each(where, roots, commands, fix)
    for command, one, two in zip(commands, first, second, strict=True):
        assert one == two, (command, one, two)
    status = json.loads(first[1][1])
    assert [i["path"] for i in status["ignored"]] == [
        "pending/.hidden",
        "pending/Aln.req.json",
        "pending/README",
        "pending/bad name.req.json",
        "pending/ln.req.json",
        "done/.x",
        "failed/junk",
    ], status
    assert [t["path"] for t in status["temps"]] == [
        "inbox/.publish-a.tmp",
        "inbox/.publish-b.tmp",
        "inbox/zz.tmp",
    ], status
    pending = first[4][1].splitlines()
    assert pending == sorted(pending, key=os.fsencode) and len(pending) == 9, pending
    assert first[5][1].splitlines() == [
        "Cl1.req.json",
        "Le1.req.json",
        "cl2.req.json",
        "le2.req.json",
    ], first[5]


def test_sessions_made_in_two_orders_list_and_show_the_same(_template: Path, place: Path) -> None:
    """S-1, docs/sessions.md: sessions of a home and of a space made in other orders are
    listed in name order, and each shows the same."""
    names = ["s-1", "S2", "a.b", "A", "0x", "zz", "default"]
    event = {
        "ts": "2026-01-02T03:04:05.000006Z",
        "type": "note",
        "agent": "coder",
        "session": "x",
        "object": "agent/coder",
        "status": "ok",
        "n": 1,
    }

    def build(root: Path, reverse: bool) -> None:
        env = base_env(root)
        made = ctx_run(
            "agent", "create", "-", env=env, input=json.dumps({"name": "coder", "label": "coder_t"})
        )
        assert made.rc == 0, made
        homes = root / "home" / str(NOBODY.pw_uid) / "agent" / "coder" / "session"
        spaces = root / "shared" / "proj" / "agent" / "coder" / "session"
        for top in (homes, spaces):
            top.mkdir(parents=True, exist_ok=True)
            for name in names[::-1] if reverse else names:
                (top / name).mkdir()
                (top / name / "events.jsonl").write_text(
                    json.dumps({**event, "session": name}) + "\n"
                )
        for dirpath, _, filenames in os.walk(root / "home" / str(NOBODY.pw_uid)):
            for entry in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
                os.chown(entry, NOBODY.pw_uid, NOBODY.pw_gid)
                os.chmod(entry, 0o600 if entry.endswith(".jsonl") else 0o700)
        os.chmod(root / "home" / str(NOBODY.pw_uid), 0o755)

    where, roots = built_in_two_orders(_template, place, build)
    listed_in_other_orders(roots, f"home/{NOBODY.pw_uid}/agent/coder/session")
    commands = [
        ["session", "list", "coder"],
        ["session", "list", "coder", "--json"],
        ["session", "list", "coder", "--project", "proj"],
        ["session", "show", "coder", "S2"],
        ["session", "show", "coder", "a.b", "--json"],
        ["session", "tail", "coder", "zz", "--project", "proj"],
    ]
    first, second = read_each(where, roots, commands)
    for command, one, two in zip(commands, first, second, strict=True):
        assert one == two, (command, one, two)
    expected = sorted(names, key=os.fsencode)
    assert first[0][1].splitlines() == expected, first[0]
    assert [s["name"] for s in json.loads(first[1][1])] == expected, first[1]
    assert first[2][1].splitlines() == expected, first[2]
    assert first[3][1].startswith("2026-01-02T03:04:05.000006Z  note"), first[3]


def test_homes_made_in_two_orders_are_named_in_numeric_order(_template: Path, place: Path) -> None:
    """docs/sessions.md (--uid): sessions of a gone agent in several homes, made in other
    orders, get the same EINVAL (exit 2) naming the homes' uids in numeric order."""
    uids = ["1000", "65534", "999", "20", "4294967294"]

    def build(root: Path, reverse: bool) -> None:
        for uid in uids[::-1] if reverse else uids:
            (root / "home" / uid / "agent" / "ghost" / "session" / "s").mkdir(parents=True)

    where, roots = built_in_two_orders(_template, place, build)
    listed_in_other_orders(roots, "home")
    commands = [["session", "list", "ghost"], ["session", "show", "ghost", "--json"]]
    first, second = read_each(where, roots, commands)
    assert first == second
    rc, out, err = first[0]
    assert (rc, out) == (2, ""), first[0]
    assert "homes of uids 20, 999, 1000, 65534, 4294967294 hold sessions" in err, err
    assert json.loads(first[1][1])["error"] == "EINVAL", first[1]


def test_roots_made_by_the_same_commands_in_two_orders_read_the_same(
    _template: Path, place: Path
) -> None:
    """R-5, X-1, T-8, T-8a, A-3: spaces, tools in three tiers, agents and a queue made by the
    same commands in another order read the same: object list and which, agent list and
    show, policy explain, and bootstrap, shared create and queue init run again."""
    manifests = place / "manifests"
    for name in ("aa.tool", "Mm.tool"):
        tool_manifest(manifests, name, "#!/bin/sh\ncat\n")
        (manifests / f"{name}.sh").chmod(0o755)
    gid = str(NOBODY.pw_gid)
    steps = [
        ["shared", "create", "zeta", "--group", gid],
        ["shared", "create", "Mid", "--group", gid],
        ["object", "install", str(manifests / "aa.tool.json"), "--tier", "user"],
        ["object", "install", str(manifests / "Mm.tool.json"), "--tier", "shared:zeta"],
        ["object", "install", str(manifests / "aa.tool.json"), "--tier", "shared:Mid"],
        ["queue", "init", "--project", "q2"],
    ]
    agents = [
        {
            "name": "coder",
            "label": "coder_t",
            "tools": ["aa.tool", "Mm.tool"],
            "shared": {"zeta": ["read"], "Mid": ["read", "write"]},
        },
        {"name": "Bob", "label": "bob_t", "tools": ["fs.stat"]},
    ]

    def build(root: Path, reverse: bool) -> None:
        # Spaces before the tools of their tiers; otherwise every step in the other order.
        ordered = [*steps[1::-1], *steps[:1:-1]] if reverse else steps
        for step in ordered:
            done = ctx_run(*step, env=base_env(root))
            assert done.rc == 0, done
        for agent in agents[::-1] if reverse else agents:
            made = ctx_run("agent", "create", "-", env=base_env(root), input=json.dumps(agent))
            assert made.rc == 0, made

    where, roots = built_in_two_orders(_template, place, build)
    listed_in_other_orders(roots, "shared")
    commands = [
        ["object", "list", "--json"],
        ["object", "which", "aa.tool"],
        ["agent", "list", "--json"],
        ["agent", "show", "coder"],
        ["agent", "show", "coder", "--json"],
        ["policy", "explain", "coder", "tool:aa.tool", "execute", "--json"],
        ["bootstrap"],
        ["shared", "create", "Mid"],
        ["queue", "init", "--project", "q2"],
    ]
    first, second = read_each(where, roots, commands)
    for command, one, two in zip(commands, first, second, strict=True):
        assert one == two, (command, one, two)
    tiers = list(dict.fromkeys(o["tier"] for o in json.loads(first[0][1])))
    assert tiers == ["system", "user", "shared:Mid", "shared:zeta"], first[0]
    assert [a["name"] for a in json.loads(first[2][1])] == ["Bob", "coder"], first[2]
    assert "nothing to do" in first[6][1] and "nothing to do" in first[7][1], first
    assert "/ctx/shared/Mid/tool:/ctx/shared/zeta/tool" in first[3][1], first[3]


def test_post_hooks_made_in_reverse_name_order_run_in_byte_order(
    searchable_storage: Path, ordered_fs: Path
) -> None:
    """T-6, docs/tools.md: hooks run in the byte order of their names, whatever order the
    directory lists them in: the failed post-hooks a call records come in that order."""
    root = copy_of_root(searchable_storage, Path(tempfile.mkdtemp(dir=ordered_fs)) / "storage")
    root.parent.chmod(0o755)
    on = OnStorage()
    on.storage = root
    workspace = root.parent / "ws"
    workspace.mkdir(mode=0o755)
    on.create_agent(
        {
            "name": "coder",
            "label": "coder_t",
            "tools": ["fs.stat"],
            "mount": [[str(workspace), "/workspace", "ro"]],
        }
    )
    on.allow_tool("coder_t", "fs.stat")
    hooks = root / "tool" / "fs.stat.d" / "hooks" / "post.d"
    names = sorted(["a", "_x", "B", "9-a", "10-b", ".dot", "~z"], key=os.fsencode)
    for name in names:  # made in name order: the tmpfs lists them newest first
        (hooks / name).write_text(f'#!/bin/sh\necho "hook {name}" >&2\nexit 1\n')
        (hooks / name).chmod(0o755)
    if os.listdir(hooks) == names:
        pytest.skip("this filesystem lists the hooks in name order however they were made")
    ran = on.ctx("run", "--agent", "coder", "fs.stat", "/workspace")
    assert ran.rc == 0, ran
    events = read_jsonl(
        root
        / "home"
        / str(NOBODY.pw_uid)
        / "agent"
        / "coder"
        / "session"
        / "default"
        / "events.jsonl"
    )
    recorded = events[-1]["post_hooks"]
    assert [h["hook"] for h in recorded] == [f"hooks/post.d/{n}" for n in names], recorded
    assert [h["message"] for h in recorded] == [f"hook {n}" for n in names], recorded


def test_bootstrap_reports_of_roots_made_in_two_orders_read_the_same(
    _template: Path, place: Path
) -> None:
    """R-5, docs/sessions.md: home sessions an older version left readable by the group and
    spaces it left without the sticky bit, made in other orders, are reported in one order:
    the tightened sessions by path, a warning per space in name order; run again, the same
    warnings and nothing repaired."""
    sessions = [("zed", "s1"), ("coder", "b"), ("coder", "a"), ("Amy", "x")]

    def build(root: Path, reverse: bool) -> None:
        for space in ("zeta", "Mid", "alpha")[:: -1 if reverse else 1]:
            made = ctx_run("shared", "create", space, env=base_env(root))
            assert made.rc == 0, made
            (root / "shared" / space / "queue").chmod(0o2770)
        home = root / "home" / str(NOBODY.pw_uid)
        for agent, session in sessions[::-1] if reverse else sessions:
            path = home / "agent" / agent / "session" / session
            path.mkdir(parents=True, exist_ok=True)
            (path / "events.jsonl").write_text("")
        for dirpath, _, filenames in os.walk(home):
            os.chown(dirpath, NOBODY.pw_uid, NOBODY.pw_gid)
            os.chmod(dirpath, 0o750)
            for name in filenames:
                os.chown(os.path.join(dirpath, name), NOBODY.pw_uid, NOBODY.pw_gid)
                os.chmod(os.path.join(dirpath, name), 0o640)
        os.chmod(home, 0o755)

    where, roots = built_in_two_orders(_template, place, build)
    listed_in_other_orders(roots, "shared")
    first, second = read_each(where, roots, [["bootstrap"], ["bootstrap", "--json"]])
    assert first == second
    lines = first[0][1].splitlines()
    repaired = [line.split()[1] for line in lines if line.startswith("repaired")]
    assert repaired == sorted(repaired, key=os.fsencode) and len(repaired) == 15, lines
    warned = [line.split()[3] for line in lines if line.startswith("warning")]
    assert warned == ["Mid:", "alpha:", "zeta:"], lines
    again = json.loads(first[1][1])
    assert again["repaired"] == [] and len(again["warnings"]) == 3, again


# ------------------------------------------------------------------ bootstrap run again


def test_bootstrap_run_again_anywhere_any_way_changes_nothing(storage: Path) -> None:
    """R-5, docs/tools.md ("Run twice, the second run changes nothing"; "whatever the
    umask"): bootstrap run again under other environments, a umask of 077 and other working
    directories, and with this source tree as SOURCE (named relatively), says nothing to do,
    in the same bytes."""
    (plain,) = same_everywhere(storage, [["bootstrap"]], [storage, storage / "tool"])
    assert plain.rc == 0 and plain.lines() == [
        f"storage root: {storage}",
        "nothing to do: the storage root is complete",
    ], plain
    proc = subprocess.run(
        [*CTX_ARGV, "bootstrap"],
        env=base_env(storage),
        capture_output=True,
        preexec_fn=lambda: os.umask(0o077),
    )
    assert (proc.returncode, proc.stdout.decode()) == (0, plain.out), proc
    again = ctx_run("bootstrap", "../", env=base_env(storage), cwd=REPO / "docs")
    assert answer(again) == answer(plain), again


def test_bootstrap_through_a_link_to_the_root_changes_nothing(
    storage: Path, tmp_path: Path
) -> None:
    link = tmp_path / "current"
    link.symlink_to(storage)
    for named in (storage, link, storage, link):
        again = ctx_run("bootstrap", "--storage", named, env=base_env())
        assert again.rc == 0, again
        assert again.lines()[1:] == ["nothing to do: the storage root is complete"], again


# ---------------------------------------------------------------- records of one call


FAILING = '#!/bin/sh\necho "abcde" >&2\nexit 3\n'


def test_the_logged_message_of_a_call_is_the_same_whatever_the_hash_seed(
    searchable_storage: Path, tmp_path: Path
) -> None:
    on = OnStorage()
    on.storage = searchable_storage
    manifest = tool_manifest(tmp_path / "m", "fails", FAILING)
    (tmp_path / "m" / "fails.sh").chmod(0o755)
    installed = on.ctx("object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed
    on.create_agent({"name": "coder", "label": "coder_t", "tools": ["fails"]})
    on.allow_tool("coder_t", "fails")
    messages = []
    for seed in ("0", "1", "2", "3"):
        ran = ctx_run(
            "run",
            "--native",
            "--agent",
            "coder",
            "--session",
            f"seed{seed}",
            "fails",
            env=base_env(searchable_storage, PYTHONHASHSEED=seed),
            input=json.dumps({"password": "abcd", "token": "bcde"}),
        )
        assert ran.rc == 1, ran
        session = (
            searchable_storage
            / "home"
            / str(NOBODY.pw_uid)
            / "agent"
            / "coder"
            / "session"
            / f"seed{seed}"
            / "events.jsonl"
        )
        message = read_jsonl(session)[-1]["message"]
        assert "abcd" not in message and "bcde" not in message, message
        messages.append(message)
    assert len(set(messages)) == 1, messages


def test_a_lease_dated_without_a_zone_is_judged_alike_in_every_zone(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    """docs/queue.md ("none means UTC"), Q-5: a lease whose expires_at has no zone, an
    hour past in UTC, is expired for every reader's TZ (read as local time west of UTC, it
    would still run): show and recover --dry-run answer the same bytes, the holder gone,
    the time printed in UTC."""
    job = queue.publish(name="tz")
    assert queue.claim("--pid", str(child.pid), "--ttl", "3600") == job
    lease = queue.lease(job)
    past = datetime.now(UTC) - timedelta(hours=1)
    lease["expires_at"] = past.strftime("%Y-%m-%dT%H:%M:%S")
    queue.write_lease(job, lease)
    shown, dry = same_everywhere(
        queue.storage,
        [
            ["queue", "show", "--project", "proj", "tz"],
            ["queue", "recover", "--project", "proj", "--dry-run"],
        ],
    )
    assert shown.lines()[-1].startswith("holder: gone"), shown
    assert f"expired at {lease['expires_at']}" in shown.lines()[-1], shown
    assert re.search(r"expired at [0-9T:.-]+Z", shown.lines()[-1]), shown
    assert dry.lines()[0].startswith("would requeue  tz.req.json"), dry
    assert queue.state(job) == "claimed"
