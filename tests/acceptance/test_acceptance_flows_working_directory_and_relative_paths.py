"""The working directory and relative paths, checked against SPEC R-1 (``--storage DIR`` and
``CTX_STORAGE`` override the default everywhere), §2.4 with docs/queue.md (a command a message
suggests names the storage root and queue as the command was told them, a path made
absolute, so that copied into another shell it acts on the same queue), Q-4 (finish), §6
T-3/T-5 with docs/tools.md (a tool's working directory is the host directory behind its
``CTX_CWD``, not its caller's), §8 A-1 (the caller's directory is the default
``/workspace``) and the README's ``ctx: ERRNO: what to do``.

``ctx`` runs as a real process from real directories: removed ones, ones the agent's uid may
not enter, ones inside the storage root and inside a queue's claim; ``--storage`` and
``CTX_STORAGE`` spelled relatively (``.``, ``..``, ``./x/``, ``x/../y``, ``a//b``, a link
followed by ``..``); FILE arguments named relatively, and ``-`` beside a file named ``-``."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    scratch_top,
    wait_for,
)
from tests.support.storage import copy_of_root

CTX = CTX_ARGV[0]
SCRATCH = scratch_top(__file__)
PROJECT = "proj"  # the template root holds this project's queue
NOBODY = 65534  # root's default uid for agents
JOB = json.dumps(request("fs.stat", input={"path": "/ctx"}))

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("bwrap") is None,
    reason="an agent terminal needs root, /dev/fuse and bubblewrap",
)


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory every uid may search, removed at the end."""
    path = new_scratch_dir(SCRATCH)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def root_in(template: Path, where: Path) -> Path:
    """A bootstrapped root holding the queue of ``proj``, at ``where``."""
    return copy_of_root(template, where)


def make_agent(root: Path, tools: list[str], name: str = "ci") -> None:
    """Agent ``name`` (uid nobody, label ``<name>_t``) with ``tools``, each granted on the
    tool's side too (P-6)."""
    req = {"name": name, "label": f"{name}_t", "tools": tools}
    made = ctx_run("--storage", root, "agent", "create", "-", input=json.dumps(req))
    assert made.rc == 0, made
    for tool in tools:
        with (root / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {name}_t tool:{tool} execute\n")


def in_shell(script: str, *args: str | Path, env: dict[str, str] | None = None) -> Run:
    """``/bin/sh -c SCRIPT sh ARGS…`` (``$1``… are ARGS; ``$CTX`` is the ctx command): for
    what needs a current directory that a shell removes or closes under itself."""
    done = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *map(str, args)],
        capture_output=True, text=True, timeout=120,
        env={**(env if env is not None else clean_env()), "CTX": CTX},
    )  # fmt: skip
    return Run(["sh", "-c", script], done.returncode, done.stdout, done.stderr)


def suggested(text: str, verb: str) -> list[str]:
    """The words of the one ``'ctx VERB …'`` command ``text`` suggests, as a shell reads
    them back (without the leading ``ctx``)."""
    start = text.index(f"'ctx {verb}")
    # A suggestion is quoted '…'; a word inside it may be quoted '…' too (shlex.quote).
    words = shlex.split(text[start:].split("' ", 1)[0] + "'")
    assert words[0].startswith("ctx "), words
    return shlex.split(words[0])[1:] + words[1:]


def copied(words: list[str], cwd: Path = Path("/"), **kw) -> Run:
    """A suggested command run as a user copies it: from another directory, with no CTX_
    setting."""
    return ctx_run(*words, cwd=cwd, env=clean_env(), **kw)


def error_line(run: Run) -> str:
    lines = [line for line in run.err.splitlines() if line.startswith("ctx: ")]
    lines = [line for line in lines if not line.startswith(("ctx: warning:", "ctx: note:"))]
    assert len(lines) == 1, run
    return lines[0]


@contextlib.contextmanager
def worker_in(cwd: Path, storage: str, *args: str) -> Iterator[subprocess.Popen]:
    """``ctx --storage STORAGE queue work --project proj --json ARGS…`` started in ``cwd``,
    once its ``start`` event is out; ended at the end of the block."""
    argv = [CTX, "--storage", storage, "queue", "work", "--project", PROJECT, "--json", *args]
    proc = subprocess.Popen(argv, cwd=cwd, env=clean_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert first and json.loads(first).get("event") == "start", (first, proc.poll())
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def settled(proc: subprocess.Popen, queue: Path, job: str) -> bool:
    """Whether ``job`` has a result, or the worker has stopped, within the deadline."""
    return wait_for(
        lambda: (
            proc.poll() is not None
            or (queue / "done" / f"{job}.result").exists()
            or (queue / "failed" / f"{job}.result").exists()
        ),
        20,
    )


# ------------------------------------------------------------------------------ storage spellings


def test_every_relative_spelling_of_the_root_names_one_root_and_its_suggestions_work_elsewhere(
    _template: Path, place: Path
) -> None:
    """R-1, §2.4 and docs/queue.md: ``--storage`` spelled ``st``, ``./st/``, ``st//``,
    ``x/../st``, ``.`` (from inside the root) and ``../..`` (from inside a tool's ``.d/``)
    names the same root, reported by its absolute path; ``--project ../`` from inside
    ``pending/`` names the queue; a refusal's suggested ``'ctx queue list …'`` names the root
    and queue absolutely, so that, copied and run from ``/``, it lists that queue."""
    root = root_in(_template, place / "st")
    (place / "x").mkdir()
    queue = root / "shared" / PROJECT / "queue"
    published = ctx_run("--storage", root, "queue", "publish", "--project", PROJECT,
                        "--name", "seen", "-", input=JOB)  # fmt: skip
    assert published.rc == 0, published
    spellings = [
        (place, "st"),
        (place, "./st/"),
        (place, "st//"),
        (place, "x/../st"),
        (root, "."),
        (root / "tool" / "fs.read.d", "../.."),
    ]
    for cwd, spelled in spellings:
        status = ctx_run("--storage", spelled, "queue", "status", "--project", PROJECT, "--json",
                         cwd=cwd)  # fmt: skip
        assert status.rc == 0, (spelled, status)
        shown = Path(status.json()["queue"])
        assert shown.is_absolute() and shown.resolve() == queue, (spelled, status)
        assert status.json()["counts"]["pending"] == 1, (spelled, status)

        refused = ctx_run("--storage", spelled, "queue", "finish", "--project", PROJECT,
                          "nosuch", "--ok", "-", input="{}", cwd=cwd)  # fmt: skip
        assert refused.rc == 1 and "Traceback" not in refused.err, refused
        assert error_line(refused).startswith("ctx: ENOENT: "), refused
        listed = copied(suggested(refused.err, "queue list"))
        assert listed.rc == 0 and "seen.req.json" in listed.out, (spelled, refused, listed)

    by_path = ctx_run("queue", "status", "--project", "../", "--json", cwd=queue / "pending")
    assert by_path.rc == 0 and Path(by_path.json()["queue"]) == queue, by_path
    refused = ctx_run("queue", "finish", "--project", "../", "nosuch", "--ok", "-",
                      input="{}", cwd=queue / "pending")  # fmt: skip
    listed = copied(suggested(refused.err, "queue list"))
    assert listed.rc == 0 and "seen.req.json" in listed.out, (refused, listed)


def test_a_suggestion_after_a_root_named_through_a_link_and_dotdot_acts_on_that_root(
    _template: Path, place: Path
) -> None:
    """§2.4 and docs/queue.md: the command follows ``--storage lnk/../st`` as the kernel
    does (``lnk`` leads to ``real/sub``, so the root is ``real/st``); the commands its
    refusals suggest, copied and run from ``/``, must act on that same root — the queue
    listed, the agents listed — and never on a root that does not exist beside the link."""
    real = place / "real"
    (real / "sub").mkdir(parents=True)
    root = root_in(_template, real / "st")
    make_agent(root, ["fs.stat"])
    (place / "lnk").symlink_to("real/sub")
    spelled = "lnk/../st"
    published = ctx_run("--storage", spelled, "queue", "publish", "--project", PROJECT,
                        "--name", "seen", "-", input=JOB, cwd=place)  # fmt: skip
    assert published.rc == 0, published
    assert (root / "shared" / PROJECT / "queue" / "pending" / "seen.req.json").is_file()

    refused = ctx_run("--storage", spelled, "queue", "finish", "--project", PROJECT, "nosuch",
                      "--ok", "-", input="{}", cwd=place)  # fmt: skip
    assert refused.rc == 1, refused
    listed = copied(suggested(refused.err, "queue list"))
    assert listed.rc == 0 and "seen.req.json" in listed.out, (refused, listed)

    no_agent = ctx_run("--storage", spelled, "run", "--agent", "other", "fs.stat", "/ctx",
                       cwd=place)  # fmt: skip
    assert no_agent.rc == 126, no_agent
    agents = copied(suggested(no_agent.err, "agent list"))
    assert agents.rc == 0 and agents.out.startswith("ci "), (no_agent, agents)
    assert not (place / "st").exists()


@needs_root
def test_a_worker_given_a_relative_root_keeps_working_after_its_start_directory_is_removed(
    _template: Path, place: Path
) -> None:
    """R-1, W-2: ``--storage ../st`` is read against the directory ctx started in, once; the
    root it names stays where it is when that directory is later removed, so a waiting
    worker goes on claiming and running the jobs published there."""
    root = root_in(_template, place / "st")
    make_agent(root, ["fs.stat"])
    start = place / "start"
    start.mkdir()
    queue = root / "shared" / PROJECT / "queue"
    with worker_in(start, "../st", "--agent", "ci") as proc:
        start.rmdir()
        published = ctx_run("--storage", root, "queue", "publish", "--project", PROJECT,
                            "--name", "after", "-", input=JOB)  # fmt: skip
        assert published.rc == 0, published
        assert settled(proc, queue, "after.req.json")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        result = json.loads((queue / "done" / "after.req.json.result").read_text())
        assert result["status"] == "ok", result


@needs_root
def test_a_worker_on_an_absolute_root_runs_jobs_after_its_start_directory_is_removed(
    _template: Path, place: Path
) -> None:
    """R-1, W-1, docs/tools.md (``CTX_CWD``): a worker whose current directory is removed
    under it keeps running jobs, and the tool of each runs in the agent's own directory
    (the host directory behind ``/ctx/home/<uid>``), not in the removed one."""
    root = root_in(_template, place / "st")
    make_agent(root, ["shell.exec"])
    start = place / "start"
    start.mkdir()
    queue = root / "shared" / PROJECT / "queue"
    with worker_in(start, str(root), "--agent", "ci") as proc:
        start.rmdir()
        req = request("shell.exec")
        req["input"] = {"cmd": "pwd"}
        published = ctx_run("--storage", root, "queue", "publish", "--project", PROJECT,
                            "--name", "where", "-", input=json.dumps(req))  # fmt: skip
        assert published.rc == 0, published
        assert settled(proc, queue, "where.req.json")
        result = json.loads((queue / "done" / "where.req.json.result").read_text())
        assert result["status"] == "ok", result
        assert str(result["output"]).strip() == str(root / "home" / str(NOBODY)), result


def test_ctxterm_written_by_a_bootstrap_given_a_relative_root_finds_it_from_anywhere(
    place: Path,
) -> None:
    """R-1, R-5 and docs/tools.md ('its default storage root is the one it was written
    into'): ``ctx bootstrap --storage ../st`` run in a directory that is removed afterwards
    leaves a ``bin/ctxterm`` that still finds ``st``: asked for an agent that does not exist,
    it names the agent, not a missing root."""
    start = place / "start"
    start.mkdir()
    made = ctx_run("bootstrap", "--storage", "../st", cwd=start)
    assert made.rc == 0, made
    start.rmdir()
    ctxterm = place / "st" / "bin" / "ctxterm"
    ran = subprocess.run([str(ctxterm), "nosuch", "--no-workspace"], capture_output=True,
                         text=True, cwd="/", env=clean_env(), timeout=60)  # fmt: skip
    assert ran.returncode == 1, ran
    assert "there is no agent 'nosuch'" in ran.stderr, ran.stderr
    assert f"storage='{place / 'st'}'" in ctxterm.read_text()


def test_an_unexpanded_tilde_or_home_in_ctx_storage_is_a_directory_of_that_name_shown_absolutely(
    place: Path,
) -> None:
    """R-1 (``CTX_STORAGE`` may be relative): a value with ``~`` or ``$HOME`` that no shell
    expanded (a service's environment file) is read as the relative path it is: the root
    made is ``CWD/~/st``, and the command's answer names it by that absolute path, so the
    user sees where it went; a reading command names ``CWD/$HOME/st`` as missing and makes
    nothing; nothing appears in the real home."""
    home = place / "home"
    home.mkdir()
    env = clean_env(CTX_STORAGE="~/st", HOME=str(home))
    made = ctx_run("queue", "init", "--project", "p", env=env, cwd=place)
    assert made.rc == 0, made
    assert str(place / "~" / "st" / "shared" / "p" / "queue") in made.out, made
    assert list(home.iterdir()) == []
    env = clean_env(CTX_STORAGE="$HOME/st", HOME=str(home))
    missing = ctx_run("queue", "status", "--project", "p", env=env, cwd=place)
    assert missing.rc == 1, missing
    assert error_line(missing).startswith("ctx: ENOENT: "), missing
    assert str(place / "$HOME" / "st") in missing.err, missing
    assert not (place / "$HOME").exists()


# ------------------------------------------------------------------------------ relative files


def test_files_named_relatively_are_read_against_the_current_directory(
    _template: Path, place: Path
) -> None:
    """§2.4, P-8, A-3, T-8: ``publish req.json``, ``publish ./-`` (the file named ``-``)
    beside ``publish -`` (standard input), ``policy check p`` (errors named as given,
    ``p:1: EINVAL``), ``agent create ../r.json`` (a relative mount source refused, EINVAL
    naming the entry, nothing made) and ``object install ../m/hi.json`` (its relative
    ``exec`` read beside the manifest) all read what the current directory names."""
    root = root_in(_template, place / "st")
    sub = place / "sub"
    sub.mkdir()
    queue = root / "shared" / PROJECT / "queue"

    def ctx(*args: str, **kw) -> Run:
        return ctx_run("--storage", "../st", *args, cwd=sub, **kw)

    (sub / "req.json").write_text(json.dumps(request("fs.stat", tag="file")))
    (sub / "-").write_text(json.dumps(request("fs.stat", tag="dash-file")))
    stdin = json.dumps(request("fs.stat", tag="stdin"))
    for name, given in (("a", "req.json"), ("b", "./-"), ("c", "-")):
        done = ctx("queue", "publish", "--project", PROJECT, "--name", name, given, input=stdin)
        assert (done.rc, done.out) == (0, f"{name}.req.json\n"), done
    tags = {n: json.loads((queue / "pending" / f"{n}.req.json").read_text())["tag"] for n in "abc"}
    assert tags == {"a": "file", "b": "dash-file", "c": "stdin"}, tags

    (sub / "p").write_text("allow a_t tool:x execut\n")
    checked = ctx("policy", "check", "p")
    assert checked.rc == 1 and checked.err.startswith("p:1: EINVAL: "), checked

    before = sorted(os.listdir(root / "agent"))
    (place / "r.json").write_text(json.dumps(
        {"name": "rel", "label": "rel_t", "mount": [["../ws", "/workspace", "rw"]]}
    ))  # fmt: skip
    created = ctx("agent", "create", "../r.json")
    assert created.rc == 1, created
    line = error_line(created)
    assert line.startswith("ctx: EINVAL: ") and "../ws" in line and "absolute" in line, created
    assert sorted(os.listdir(root / "agent")) == before

    (place / "m").mkdir()
    (place / "m" / "hi.sh").write_text("#!/bin/sh\necho hi-from-tool\n")
    (place / "m" / "hi.sh").chmod(0o755)
    (place / "m" / "hi.json").write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "demo.hi", "description": "says hi",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "hi.sh",
    }))  # fmt: skip
    installed = ctx("object", "install", "../m/hi.json", "--tier", "system")
    assert installed.rc == 0, installed
    assert os.access(root / "tool" / "demo.hi", os.X_OK), installed
    which = ctx_run("--storage", root, "object", "which", "demo.hi", cwd=Path("/"))
    assert (which.rc, which.out) == (0, f"{root}/tool/demo.hi\n"), which


def test_relative_files_from_a_removed_directory_are_named_and_nothing_is_done(
    _template: Path, place: Path
) -> None:
    """R-1 and the README's ``ctx: ERRNO: what to do``: from a current directory that was
    removed, ``publish req.json``, ``agent create r.json`` and ``object install ./m.json``
    are ENOENT naming the file, exit 1, with no traceback; the queue, the agents and the
    tools stay as they were."""
    root = root_in(_template, place / "st")
    gone = place / "gone"
    gone.mkdir()
    queue = root / "shared" / PROJECT / "queue"
    before = (sorted(os.listdir(root / "agent")), sorted(os.listdir(root / "tool")))
    script = (
        'cd "$1" && rmdir "$1" && shift; '
        'for args in "queue publish --project proj req.json" "agent create r.json" '
        '"object install ./m.json --tier system"; do '
        '  $CTX $args; echo "rc=$?" >&2; done'
    )
    done = in_shell(script, gone, env=clean_env(CTX_STORAGE=str(root)))
    assert "Traceback" not in done.err, done
    lines = done.err.splitlines()
    assert lines.count("rc=1") == 3, done
    errors = [line for line in lines if line.startswith("ctx: ")]
    assert len(errors) == 3 and all(e.startswith("ctx: ENOENT: ") for e in errors), done
    for named, error in zip(("req.json", "r.json", "m.json"), errors, strict=True):
        assert named in error, (named, error)
    assert os.listdir(queue / "pending") == []
    assert (sorted(os.listdir(root / "agent")), sorted(os.listdir(root / "tool"))) == before


# ------------------------------------------------------------------------------ inside the queue


def test_finish_with_its_result_file_inside_the_claim_directory_is_not_left_half_done(
    _template: Path, place: Path
) -> None:
    """Q-4, Q-6, I-1: a shell worker that works in ``claimed/J/`` (where ``ctx queue show``
    shows the request) writes its result there and runs ``finish J --ok out.json``.  Either
    the finish refuses before anything moves (J stays claimed, no result written), or it
    completes and the queue is consistent; it never moves J to ``done/`` and then fails,
    leaving a conflict."""
    root = root_in(_template, place / "st")
    queue = root / "shared" / PROJECT / "queue"
    env = clean_env(CTX_STORAGE=str(root))
    assert ctx_run("queue", "publish", "--project", PROJECT, "--name", "j", "-", input=JOB,
                   env=env).rc == 0  # fmt: skip
    claimed = ctx_run("queue", "claim", "--project", PROJECT, "--ttl", "600", env=env)
    assert (claimed.rc, claimed.out) == (0, "j.req.json\n"), claimed
    inside = queue / "claimed" / "j.req.json"
    (inside / "out.json").write_text('{"answer": 42}')
    finished = ctx_run("queue", "finish", "--project", PROJECT, "j.req.json", "--ok", "out.json",
                       env=env, cwd=inside)  # fmt: skip
    assert "Traceback" not in finished.err, finished
    status = ctx_run("queue", "status", "--project", PROJECT, "--json", env=env)
    if finished.rc == 0:
        assert (queue / "done" / "j.req.json.result").is_file(), finished
        assert status.rc == 0 and status.json()["conflict"] == 0, status
    else:
        assert (inside / "j.req.json").is_file(), finished
        assert not (queue / "done" / "j.req.json.result").exists(), finished
        assert not (queue / "done" / "j.req.json").exists(), finished


def test_finish_run_inside_the_claim_it_removes_completes_and_the_next_commands_still_work(
    _template: Path, place: Path
) -> None:
    """Q-4, R-1: a finish run from inside ``claimed/J/`` with the result on standard input
    removes that directory (its own current directory) and succeeds; a claim, a finish and a
    status run next from the removed directory, on the absolute root, work too."""
    root = root_in(_template, place / "st")
    queue = root / "shared" / PROJECT / "queue"
    env = clean_env(CTX_STORAGE=str(root))
    for name in ("one", "two"):
        assert ctx_run("queue", "publish", "--project", PROJECT, "--name", name, "-", input=JOB,
                       env=env).rc == 0  # fmt: skip
    assert ctx_run("queue", "claim", "--project", PROJECT, "--ttl", "600", env=env).rc == 0
    script = (
        'cd "$1/claimed/one.req.json" && '
        'echo "{}" | $CTX queue finish --project proj one.req.json --ok - && '
        'test ! -d "$1/claimed/one.req.json" && '
        "J=$($CTX queue claim --project proj --ttl 600) && "
        'echo "{}" | $CTX queue finish --project proj "$J" --ok - && '
        "$CTX queue status --project proj --json"
    )
    done = in_shell(script, queue, env=env)
    assert done.rc == 0 and "Traceback" not in done.err, done
    assert json.loads(done.lines()[-1])["done"] == 2, done
    assert sorted(os.listdir(queue / "claimed")) == [] and os.listdir(queue / "lease") == []


# ------------------------------------------------------------------------------ tools and terminals


@needs_root
def test_a_tools_working_directory_is_the_agents_whatever_the_callers(
    _template: Path, place: Path
) -> None:
    """T-3, T-5 and docs/tools.md (``CTX_CWD``: the agent's home view, the process's working
    directory the host directory behind it): ``ctx run`` of ``shell.exec pwd`` from a
    removed directory, from a directory the agent's uid may not enter, and from inside the
    storage root with ``--storage .`` runs the tool in ``home/<uid>`` each time."""
    root = root_in(_template, place / "st")
    make_agent(root, ["shell.exec"])
    home = root / "home" / str(NOBODY)
    closed = place / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    gone = place / "gone"
    gone.mkdir()
    call = ["run", "--agent", "ci", "shell.exec", 'pwd; echo "$CTX_CWD"']
    removed = in_shell(
        'cd "$1" && rmdir "$1" && shift && $CTX "$@"', gone, "--storage", root, *call
    )
    from_closed = ctx_run("--storage", root, *call, cwd=closed)
    from_root = ctx_run("--storage", ".", *call, cwd=root)
    for ran in (removed, from_closed, from_root):
        assert ran.rc == 0 and "Traceback" not in ran.err, ran
        assert ran.out == f"{home}\n/ctx/home/{NOBODY}\n", ran


@needs_terminal
def test_agent_start_from_a_removed_directory_names_it_or_starts_without_a_workspace(
    _template: Path, place: Path
) -> None:
    """A-1: the default ``/workspace`` is the caller's directory; from one that was removed,
    ``ctx agent start`` is ENOENT saying so and what to give instead, exit 1, with no
    terminal left; ``--no-workspace`` starts the terminal (``workspace`` null) and ``ctx agent
    stop`` ends it."""
    root = root_in(_template, place / "st")
    make_agent(root, ["fs.stat"])
    gone = place / "gone"
    gone.mkdir()
    script = (
        'cd "$1" && rmdir "$1" && shift && '
        '$CTX "$@" --session s1 --json; echo "rc=$?"; '
        '$CTX "$@" --session s2 --no-workspace --json; echo "rc=$?"'
    )
    done = in_shell(script, gone, "--storage", root, "agent", "start", "ci")
    try:
        assert "Traceback" not in done.err, done
        first, second = [line for line in done.out.splitlines() if line.startswith("rc=")]
        assert first == "rc=1", done
        assert "ctx: ENOENT: the current directory" in done.err and "--no-workspace" in done.err
        assert second == "rc=0", done
        started = [json.loads(line) for line in done.out.splitlines() if line.startswith("{")]
        assert started[-1]["session"] == "s2" and started[-1]["workspace"] is None, done
    finally:
        for session in ("s1", "s2"):
            ctx_run("--storage", root, "agent", "stop", "ci", "--session", session)
    sessions = root / "home" / str(NOBODY) / "agent" / "ci" / "session"
    assert not (sessions / "s1" / "terminal" / "main.sock").exists()


@needs_terminal
def test_agent_start_with_a_relative_workspace_from_a_removed_directory_says_why(
    _template: Path, place: Path
) -> None:
    """A-1 and the README's ``ctx: ERRNO: what to do``: ``--workspace .`` and
    ``--workspace ../ws`` given in a directory that was removed are refused (ENOENT, exit 1)
    with a message that names the workspace given or the removed current directory, as the
    default workspace's refusal does, and no terminal is left."""
    root = root_in(_template, place / "st")
    make_agent(root, ["fs.stat"])
    (place / "ws").mkdir()
    gone = place / "gone"
    gone.mkdir()
    script = (
        'cd "$1" && rmdir "$1" && shift && '
        '$CTX "$@" --session s1 --workspace .; echo "rc=$?"; '
        '$CTX "$@" --session s2 --workspace ../ws; echo "rc=$?"'
    )
    done = in_shell(script, gone, "--storage", root, "agent", "start", "ci")
    try:
        assert "Traceback" not in done.err, done
        assert done.out.splitlines() == ["rc=1", "rc=1"], done
        errors = done.err.splitlines()
        assert len(errors) == 2 and all(e.startswith("ctx: ENOENT: ") for e in errors), done
        for error in errors:
            assert "workspace" in error or "current directory" in error, error
    finally:
        for session in ("s1", "s2"):
            ctx_run("--storage", root, "agent", "stop", "ci", "--session", session)
