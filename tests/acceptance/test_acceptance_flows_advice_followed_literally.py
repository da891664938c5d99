"""A user who reads a refusal of ``ctx`` and does what it says, literally: the command quoted in
the message (``'ctx queue init …'``, ``'ctx bootstrap …'``, ``'ctx shared create …'``,
``'ctx session repair'``, ``'ctx tool tsh.config KEY=VALUE'``, ``'ctx mount'`` …) is copied,
its placeholders (``REQUEST.json``, ``AGENT``, ``KEY=VALUE``) filled in and nothing else
added, and run as the same user in a shell without ``$CTX_STORAGE``; then the command that was
refused is run again.  Advice that names an option or argument the command does not take,
leaves out one it needs, or leaves out the ``--storage`` / ``--project`` the refused command
was given (so that, copied, it acts on another storage root) misleads; and ``--json`` errors
carry the same advice as the text on stderr.

SPEC ids: R-1 (storage root chosen by --storage), R-5 (bootstrap repairs), §2.4 and Q-5/Q-6
(queue init, recover --reconcile), W-1 (worker results name what denied), S-5 (session repair
of a torn line), X-1 (shared create), P-6 (both policy layers), H-3 and H-4 (ctx tool,
tsh.config), A-3 (agent create), D-1 (manual pages), F-1 (mount).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    request,
    scratch_top,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
PROJECT = "proj"
SUGGESTED = re.compile(r"'(ctx [^']*)'")


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def top() -> Iterator[Path]:
    """A scratch directory every uid may search (agents run as ``nobody``)."""
    made = new_scratch_dir(SCRATCH)
    try:
        yield made
    finally:
        for path in (made / "m",):
            if mounted_at(path):
                ctx_run("umount", path)
            if mounted_at(path):
                subprocess.run(["umount", "-l", str(path)], check=False)
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def root(_template: Path, top: Path) -> Path:
    """A bootstrapped storage root with queue ``proj`` (the suite's template), in ``top``."""
    made = copy_of_root(_template, top / "storage")
    made.chmod(0o755)
    return made


def ctx(*args: str | os.PathLike, **kw) -> Run:
    """``ctx ARGS`` with no ``CTX_*`` variable: the root is what the options name."""
    return ctx_run(*args, **kw)


def as_user(user: UnprivilegedUser, argv: list[str], env: dict[str, str]) -> Run:
    done = subprocess.run(
        argv, capture_output=True, env=env, user=user.uid, group=user.gid, extra_groups=[],
        stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip
    return Run(argv[len(CTX_ARGV) :], done.returncode, done.stdout.decode(), done.stderr.decode())


def advice(text: str, first: str) -> str:
    """The one command quoted in ``text`` that starts with ``first`` (``'ctx queue init'``)."""
    found = [c for c in SUGGESTED.findall(text) if c.startswith(first)]
    assert found, f"no {first!r} suggested in: {text}"
    return found[0]


def words_of(command: str, **fill: str) -> list[str]:
    """The argv of a suggested ``ctx`` command, its placeholders replaced as ``fill`` says."""
    words = shlex.split(command)
    assert words[0] == "ctx", command
    return [*CTX_ARGV, *(fill.get(word, word) for word in words[1:])]


def follow(command: str, *, user: UnprivilegedUser | None = None, env=None, **fill: str) -> Run:
    """Run the suggested ``command`` as printed (placeholders filled in), in a clean shell."""
    argv = words_of(command, **fill)
    env = env if env is not None else clean_env()
    if user is not None:
        return as_user(user, argv, env)
    done = subprocess.run(argv, capture_output=True, env=env, stdin=subprocess.DEVNULL, timeout=60)
    return Run(argv[len(CTX_ARGV) :], done.returncode, done.stdout.decode(), done.stderr.decode())


def json_error(r: Run) -> dict:
    document = json.loads(r.out)
    assert set(document) >= {"error", "errno", "message"}, r
    return document


def same_advice(text: Run, as_json: Run) -> None:
    """The ``--json`` error of a refusal carries the sentence its text form prints."""
    assert text.rc == as_json.rc != 0, (text, as_json)
    document = json_error(as_json)
    assert f"ctx: {document['error']}: " in text.err, (text, as_json)
    assert document["message"] in text.err, (text, as_json)
    assert SUGGESTED.findall(document["message"]) == SUGGESTED.findall(text.err), (text, as_json)


def publish(storage: Path, name: str, req: dict | None = None) -> str:
    r = ctx("queue", "publish", "--storage", storage, "--project", PROJECT, "--name", name, "-",
            input=json.dumps(req or request()))  # fmt: skip
    assert r.rc == 0, r
    return r.out.strip()


def make_agent(storage: Path, top: Path, name: str = "coder", tools=("fs.read",)) -> Path:
    req = {"name": name, "label": f"{name}_t", "tools": list(tools), "model": [], "shared": {},
           "mount": []}  # fmt: skip
    path = top / f"{name}.request.json"
    path.write_text(json.dumps(req))
    return path


def torn_session(storage: Path, events: Path) -> None:
    events.parent.mkdir(parents=True, exist_ok=True)
    line = {"ts": "2026-06-22T12:00:00Z", "type": "note", "agent": "coder", "session": "s1",
            "object": "x", "status": "ok"}  # fmt: skip
    events.write_text(json.dumps(line) + '\n{"ts": "2026')


# ---------------------------------------------------------------------------------------------
# advice that works when copied


def test_missing_storage_root_bootstrap_advice_makes_it(top: Path) -> None:
    """R-1, R-5: a root named by --storage that is not there; the bootstrap it names makes it."""
    absent = top / "absent"
    refused = ctx("agent", "list", "--storage", absent)
    assert refused.rc == 1 and "ENOENT" in refused.err, refused
    same_advice(refused, ctx("agent", "list", "--storage", absent, "--json"))
    done = follow(advice(refused.err, "ctx bootstrap"))
    assert done.rc == 0, done
    again = ctx("agent", "list", "--storage", absent)
    assert again.rc == 0, again


def test_missing_queue_init_advice_names_root_and_project(top: Path) -> None:
    """§2.4: a status of a queue that is not there; the init it names makes that queue."""
    storage = top / "fresh"
    refused = ctx("queue", "status", "--storage", storage, "--project", "p1")
    assert refused.rc == 1, refused
    same_advice(refused, ctx("queue", "status", "--storage", storage, "--project", "p1", "--json"))
    command = advice(refused.err, "ctx queue init")
    done = follow(command)
    assert done.rc == 0, done
    assert (storage / "shared" / "p1" / "queue" / "pending").is_dir()
    again = ctx("queue", "status", "--storage", storage, "--project", "p1", "--json")
    assert again.rc == 0 and again.json()["counts"]["pending"] == 0, again


def test_claim_without_lease_reconcile_advice_returns_the_job(root: Path) -> None:
    """Q-3, Q-6: a claim whose lease was never written cannot be finished; the recover the
    refusal names puts it back to pending, and a claim and finish then succeed."""
    job = publish(root, "j1")
    claim = ctx("queue", "claim", "--storage", root, "--project", PROJECT, "--pid", os.getpid())
    assert claim.rc == 0 and claim.out.strip() == job, claim
    shutil.rmtree(root / "shared" / PROJECT / "queue" / "lease" / job)
    finish = ["queue", "finish", "--storage", root, "--project", PROJECT, job, "--ok", "-"]
    refused = ctx(*finish, input="{}")
    assert refused.rc == 1, refused
    same_advice(refused, ctx(*finish[:-1], "--json", "-", input="{}"))
    command = advice(refused.err, "ctx queue recover")
    done = follow(command)
    assert done.rc == 0, done
    assert (root / "shared" / PROJECT / "queue" / "pending" / job).is_file()
    claim = ctx("queue", "claim", "--storage", root, "--project", PROJECT, "--pid", os.getpid())
    assert claim.rc == 0 and claim.out.strip() == job, claim
    finished = ctx(*finish, input="{}")
    assert finished.rc == 0, finished
    assert (root / "shared" / PROJECT / "queue" / "done" / f"{job}.result").is_file()


def test_unknown_agent_advice_lists_and_creates(root: Path, top: Path) -> None:
    """A-3: a run as an agent that is not there names 'agent list' and 'agent create
    REQUEST.json'; both work copied, and the run then reaches the tool."""
    run = ["--storage", root, "run", "--agent", "coder", "fs.read", '{"path": "note.txt"}']
    refused = ctx(*run)
    assert refused.rc != 0 and "ENOENT" in refused.err, refused
    listed = follow(advice(refused.err, "ctx agent list"))
    assert listed.rc == 0 and "coder" not in listed.out, listed
    made = follow(advice(refused.err, "ctx agent create"), **{"REQUEST.json": str(make_agent(
        root, top))})  # fmt: skip
    assert made.rc == 0, made
    assert "coder" in follow(advice(refused.err, "ctx agent list")).out
    with (root / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:fs.read execute\n")
    home = root / "home" / "65534"
    home.mkdir(exist_ok=True)
    (home / "note.txt").write_text("hello\n")
    (home / "note.txt").chmod(0o644)
    again = ctx(*run)
    assert again.rc == 0 and again.out == "hello\n", again


def test_ctx_tool_refusal_names_the_agent_run_that_works(root: Path, top: Path) -> None:
    """H-3: ctx tool refuses fs.read and names 'ctx run --agent AGENT fs.read' on this root;
    with the agent filled in, that runs the tool."""
    assert ctx("agent", "create", make_agent(root, top), "--storage", root).rc == 0
    with (root / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:fs.read execute\n")
    home = root / "home" / "65534"
    home.mkdir(exist_ok=True)
    (home / "note.txt").write_text("hello\n")
    (home / "note.txt").chmod(0o644)
    refused = ctx("--storage", root, "tool", "fs.read", '{"path": "note.txt"}')
    assert refused.rc == 1 and "EACCES" in refused.err, refused
    command = advice(refused.err, "ctx")
    assert "--storage" in shlex.split(command), command
    done = follow(command + ' \'{"path": "note.txt"}\'', AGENT="coder")
    assert done.rc == 0 and done.out == "hello\n", done


def test_run_in_missing_space_shared_create_advice_makes_it(root: Path, top: Path) -> None:
    """X-1: a run in a shared space that is not there names 'ctx shared create NAME'; copied,
    it makes the space, and the run is no longer refused for a missing space."""
    assert ctx("agent", "create", make_agent(root, top), "--storage", root).rc == 0
    run = ["--storage", root, "run", "--agent", "coder", "--project", "team", "fs.read", "{}"]
    refused = ctx(*run)
    assert refused.rc != 0 and "shared/team does not exist" in refused.err, refused
    done = follow(advice(refused.err, "ctx shared create"))
    assert done.rc == 0, done
    assert (root / "shared" / "team" / "queue" / "pending").is_dir()
    again = ctx(*run)
    assert "does not exist" not in again.err, again


def test_worker_denial_names_the_rule_and_the_file(root: Path, top: Path) -> None:
    """W-1, P-6: a job denied at the tool's policy is failed with the rule and the file that
    lack it; that rule appended to that file, the same job published again is done."""
    assert ctx("agent", "create", make_agent(root, top), "--storage", root).rc == 0
    publish(root, "first", request("fs.read", input={"path": "note.txt"}))
    work = ["queue", "work", "--storage", root, "--project", PROJECT, "--drain", "--agent", "coder"]
    assert ctx(*work).rc == 0
    failed = json.loads((root / "shared" / PROJECT / "queue" / "failed" / "first.req.json.result")
                        .read_text())  # fmt: skip
    said = re.search(r"(tool/\S+\.d/policy) has no rule '([^']+)'", failed["reason"])
    assert said, failed
    with (root / said[1]).open("a") as policy:
        policy.write(said[2] + "\n")
    (root / "home" / "65534" / "note.txt").write_text("hi\n")
    (root / "home" / "65534" / "note.txt").chmod(0o644)
    publish(root, "second", request("fs.read", input={"path": "note.txt"}))
    assert ctx(*work).rc == 0
    assert (root / "shared" / PROJECT / "queue" / "done" / "second.req.json.result").is_file()


def test_queue_group_remedy_chmod_clears_the_report(
    root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """§2.4 status: a state directory of a group queue that lost its setgid bit is reported
    with the command that repairs it; run as printed, the report is gone."""
    made = ctx("shared", "create", "team", "--group", str(unprivileged_user.gid), "--storage",
               root)  # fmt: skip
    assert made.rc == 0, made
    pending = root / "shared" / "team" / "queue" / "pending"
    pending.chmod(pending.stat().st_mode & ~0o2000)
    status = ctx("queue", "status", "--storage", root, "--project", "team", "--json")
    assert status.rc == 0, status
    reports = status.json()["group_not_inherited"]
    assert [entry["path"] for entry in reports] == ["pending"], status
    remedy = reports[0]["remedy"].split("run: ", 1)[1]
    done = subprocess.run(shlex.split(remedy), capture_output=True, timeout=30)
    assert done.returncode == 0, done
    assert (
        ctx("queue", "status", "--storage", root, "--project", "team", "--json").json()[
            "group_not_inherited"
        ]
        == []
    )


def test_missing_manual_page_bootstrap_advice_installs_it(root: Path) -> None:
    """D-1: a manual page missing from the bundle; the bootstrap the note names puts it back."""
    (root / "shared" / "cortexfs-docs" / "man" / "ctx.agent.md").unlink()
    shown = ctx("man", "agent", "--storage", root)
    assert shown.rc == 0 and "no page is installed" in shown.err, shown
    done = follow(advice(shown.err, "ctx bootstrap"))
    assert done.rc == 0, done
    again = ctx("man", "agent", "--storage", root)
    assert again.rc == 0 and again.err == "", again


def test_missing_session_advice_lists_the_sessions(root: Path, top: Path) -> None:
    """S-1: a session that is not there names the listing of the agent's sessions."""
    events = root / "home" / "0" / "agent" / "coder" / "session" / "default" / "events.jsonl"
    events.parent.mkdir(parents=True)
    events.write_text('{"ts": "2026-06-22T12:00:00Z", "type": "note"}\n')
    refused = ctx("session", "show", "coder", "--session", "other", "--storage", root)
    assert refused.rc == 1, refused
    same_advice(refused, ctx("session", "show", "coder", "--session", "other", "--storage",
                             root, "--json"))  # fmt: skip
    listed = follow(advice(refused.err, "ctx session list"))
    assert listed.rc == 0 and listed.out.split() == ["default"], listed


def test_non_root_default_root_bootstrap_advice_as_that_user(
    top: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1, R-5, H-4: a user without a root of their own asks tsh.config; the bootstrap the
    refusal names, run as that user, makes the root, and tsh.config then works."""
    data = top / "xdg"
    data.mkdir()
    os.chown(data, unprivileged_user.uid, unprivileged_user.gid)
    env = clean_env(XDG_DATA_HOME=str(data), HOME=str(data))
    call = [*CTX_ARGV, "tool", "tsh.config", "max_loaded_tools=7"]
    refused = as_user(unprivileged_user, call, env)
    assert refused.rc == 1 and "ENOENT" in refused.err, refused
    same_advice(refused, as_user(unprivileged_user, [*call[:2], "--json", *call[2:]], env))
    done = follow(advice(refused.err, "ctx bootstrap"), user=unprivileged_user, env=env)
    assert done.rc == 0, done
    again = as_user(unprivileged_user, call, env)
    assert again.rc == 0 and "max_loaded_tools=7" in again.out, again


# ---------------------------------------------------------------------------------------------
# advice that does not work when copied


def test_torn_line_note_names_the_session_to_repair(root: Path) -> None:
    """S-5: a shared session with a torn last line; the note of 'session show' names the
    repair, which, copied, must repair that session so that the note is gone."""
    assert ctx("shared", "create", "team", "--storage", root).rc == 0
    events = root / "shared" / "team" / "agent" / "coder" / "session" / "s1" / "events.jsonl"
    torn_session(root, events)
    show = ["session", "show", "coder", "--session", "s1", "--project", "team", "--storage", root]
    shown = ctx(*show)
    assert shown.rc == 0 and "torn line" in shown.err, shown
    done = follow(advice(shown.err, "ctx session repair"))
    assert done.rc == 0, done
    again = ctx(*show)
    assert again.rc == 0 and "torn" not in again.err, again


def test_missing_space_of_a_session_names_the_space_to_create(root: Path) -> None:
    """X-1, S-1: a session asked in a shared space that is not there; the space creation the
    refusal names, copied, makes that space."""
    show = ["session", "show", "coder", "--project", "team", "--storage", root]
    refused = ctx(*show)
    assert refused.rc == 1 and "no shared space 'team'" in refused.err, refused
    same_advice(refused, ctx(*show, "--json"))
    done = follow(advice(refused.err, "ctx shared create"))
    assert done.rc == 0, done
    assert (root / "shared" / "team" / "agent").is_dir()


def test_tsh_config_refusal_names_the_root_it_was_given(
    root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """H-4, R-1: a user who may not change the configuration is sent to its owner; the command
    the owner (root) copies must change this root's configuration."""
    call = [*CTX_ARGV, "--storage", str(root), "tool", "tsh.config", "max_loaded_tools=9"]
    refused = as_user(unprivileged_user, call, clean_env())
    assert refused.rc == 1 and "EACCES" in refused.err, refused
    as_json = as_user(unprivileged_user, [*call[:4], "--json", *call[4:]], clean_env())
    same_advice(refused, as_json)
    command = advice(refused.err, "ctx ")
    assert "tool tsh.config KEY=VALUE" in command, command
    # Copied as printed, a command without the root acts on the default root, not this one.
    assert "--storage" in shlex.split(command), command
    done = follow(command, **{"KEY=VALUE": "max_loaded_tools=9"})
    assert done.rc == 0, done
    assert "max_loaded_tools=9" in (root / "tool" / "tsh.d" / "config").read_text()


def test_tsh_config_missing_file_warning_names_the_root(root: Path) -> None:
    """H-4, R-5: the configuration file is missing; the bootstrap the warning names must be
    the one of this root, which puts the file back."""
    (root / "tool" / "tsh.d" / "config").unlink()
    shown = ctx("--storage", root, "tool", "tsh.config")
    assert shown.rc == 0 and "does not exist" in shown.err, shown
    command = advice(shown.err, "ctx bootstrap")
    # Copied as printed, a bootstrap without the root would make the default root.
    assert "--storage" in shlex.split(command), command
    done = follow(command)
    assert done.rc == 0, done
    assert (root / "tool" / "tsh.d" / "config").is_file()


@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
def test_non_root_mount_refusal_names_a_mount_root_can_run(
    root: Path, top: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1: the mount a user may not make is sent to root; the command root copies must mount
    this root at this mount point."""
    if os.access("/dev/fuse", os.R_OK | os.W_OK) and os.stat("/dev/fuse").st_mode & 0o006 == 0o006:
        pytest.skip("/dev/fuse is open to every user here: the mount is not refused")
    where = top / "m"
    where.mkdir()
    os.chown(where, unprivileged_user.uid, unprivileged_user.gid)
    refused = as_user(unprivileged_user, [*CTX_ARGV, "mount", "--storage", str(root), str(where)],
                      clean_env())  # fmt: skip
    assert refused.rc != 0 and "cannot mount" in refused.err, refused
    command = advice(refused.err, "ctx mount")
    assert str(where) in shlex.split(command), command
    proc = subprocess.Popen(words_of(command), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=clean_env(), start_new_session=True)  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(where) or proc.poll() is not None, MOUNT_WAIT)
        assert mounted_at(where)
        assert (where / "tool" / "fs.read").exists()
    finally:
        if mounted_at(where):
            ctx_run("umount", where)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
