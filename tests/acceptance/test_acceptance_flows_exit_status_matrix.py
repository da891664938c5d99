"""The exit statuses of every ``ctx`` command, ``tsh`` and ``ctxmcp``, class by class, as the
documents state them: 0 success, 1 a refusal, denial or conflict (``EACCES``, ``ENOENT``,
``EEXIST``), 2 a malformed command line (an unknown option, a bad number, a missing
argument), 3 nothing to claim, 74 an output that could not be written (``> /dev/full``), 141
a reader that left (a closed pipe), 130 after Ctrl-C, 126 and 127 for a tool refused or not
found; each error a ``ctx: ERRNO: sentence`` line on standard error, and with ``--json`` the
same error as one object on standard output, only where ``--json`` exists.  Standard output
closed (``>&-``) stops the queue commands whose answer is their output with ``EBADF``.

SPEC §2.4, Q-1, Q-2, Q-6, P-8, T-3, T-8a, H-2, H-3, M-1, F-1; README ("The queue in five
commands"); docs/queue.md (CLI), docs/policy.md (Commands), docs/tools.md (ctx run, tsh,
ctx tool, ctxmcp), docs/sessions.md (tail), docs/workers.md (Signals, Output),
docs/mount.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    clean_env,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
REQUEST = {"tool": "fs.stat", "input": {"path": "/"}}
# `ctx: ERRNO: sentence` (tsh and ctxmcp name themselves).
ERROR_LINE = re.compile(r"^(ctx|tsh|ctxmcp): (E[A-Z0-9]+): \S")
EXIT_OUTPUT_FAILED = 74
EXIT_READER_GONE = 141

# ---------------------------------------------------------------------------------------------
# helpers


@dataclass(repr=False)
class Raw:
    """One command: its argv, exit status and both outputs as text."""

    argv: list
    rc: int
    out: str
    err: str

    def __repr__(self) -> str:
        command = " ".join(map(str, self.argv))
        return (
            f"$ {command}\nexit {self.rc}\n"
            f"stdout: {self.out[:1500]!r}\nstderr: {self.err[-1500:]!r}"
        )

    def errors(self) -> list[tuple[str, str]]:
        """(program, ERRNO) of every ``PROG: ERRNO: sentence`` line on stderr."""
        found = []
        for line in self.err.splitlines():
            match = ERROR_LINE.match(line)
            if match:
                found.append((match.group(1), match.group(2)))
        return found

    def json_error(self) -> dict:
        """The one error object on stdout."""
        lines = [line for line in self.out.splitlines() if line.strip()]
        assert len(lines) == 1, self
        obj = json.loads(lines[0])
        assert set(obj) >= {"error", "errno", "message"}, self
        return obj


def run(argv: list, env: dict, output: str = "pipe", input: bytes = b"", **kw) -> Raw:
    """``argv`` with its standard output ``pipe`` (read), ``closed`` (``>&-``), ``full``
    (``> /dev/full``) or ``gone`` (a pipe whose reader has already left)."""
    argv = [str(a) for a in argv]
    common = dict(input=input, stderr=subprocess.PIPE, env=env, timeout=60, **kw)
    if output == "pipe":
        done = subprocess.run(argv, stdout=subprocess.PIPE, **common)
        return Raw(
            argv, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode()
        )
    if output == "closed":
        done = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", *argv], **common)
    elif output == "full":
        with open("/dev/full", "wb") as full:
            done = subprocess.run(argv, stdout=full, **common)
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run(argv, stdout=write_end, **common)
        finally:
            os.close(write_end)
    return Raw(argv, done.returncode, "", done.stderr.decode(errors="replace"))


@dataclass
class World:
    """A bootstrapped root with project ``proj``'s queue, agent ``coder`` (label ``coder_t``)
    allowed the tool ``echo3`` (prints its argv, exits 3), a valid policy file and a
    manifest, in a directory every uid may search."""

    top: Path
    storage: Path
    policy: Path
    manifest: Path
    request: Path

    @property
    def env(self) -> dict:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *words, output: str = "pipe", input: bytes = b"", env: dict | None = None):
        return run([*CTX_ARGV, *words], env or self.env, output, input)

    def tsh(self, *words, output: str = "pipe", input: bytes = b""):
        return run([self.storage / "bin" / "tsh", *words], self.env, output, input)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__), "world")
    storage = copy_of_root(_template, top / "storage")
    w = World(top, storage, top / "policy", top / "echo3.json", top / "request.json")
    w.policy.write_text("allow coder_t tool:echo3 execute\n")
    w.request.write_text(json.dumps(REQUEST))
    (top / "echo3.sh").write_text('#!/bin/sh\necho "hello $*"\nexit 3\n')
    w.manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": "echo3",
                "description": "Prints its arguments, then exits 3.",
                "schema": {"type": "object"},
                "cap": {"side_effects": False, "network": False},
                "exec": "echo3.sh",
            }
        )
    )
    made = w.ctx("object", "install", "--source", storage, w.manifest, "--tier", "system")
    assert made.rc == 0, made
    made = w.ctx("agent", "create", "-", input=b'{"name": "coder", "label": "coder_t"}')
    assert made.rc == 0, made
    for policy in (
        storage / "agent" / "coder.d" / "policy",
        storage / "tool" / "echo3.d" / "policy",
    ):
        with policy.open("a") as rules:
            rules.write("allow coder_t tool:echo3 execute\n")
    made = w.ctx("queue", "init", "--project", "empty")
    assert made.rc == 0, made
    made = w.ctx("queue", "publish", "--project", "proj", "--name", "listed", w.request)
    assert made.rc == 0, made
    made = w.ctx("run", "--agent", "coder", "echo3")
    assert made.rc == 3, made
    yield w
    shutil.rmtree(top, ignore_errors=True)


def assert_refusal(r: Raw, status: int, errno_name: str, as_json: bool, program: str = "ctx"):
    """``r`` ended with ``status``, saying ``errno_name`` as ``PROG: ERRNO: sentence`` on
    stderr, with the same error as the one object on stdout under ``--json`` and nothing on
    stdout otherwise."""
    assert r.rc == status, r
    assert (program, errno_name) in r.errors(), r
    if as_json:
        obj = r.json_error()
        assert obj["error"] == errno_name, r
        assert isinstance(obj["errno"], int) and obj["errno"] > 0, r
    else:
        assert r.out == "", r


# ---------------------------------------------------------------------------------------------
# 2: a malformed command line

# Every command, with the words that make a valid start before the malformed part, and
# whether it takes --json.
COMMANDS = [
    (["queue", "init", "--project", "proj"], True),
    (["queue", "publish", "--project", "proj", "-"], True),
    (["queue", "claim", "--project", "proj"], True),
    (["queue", "renew", "--project", "proj", "j"], True),
    (["queue", "finish", "--project", "proj", "j", "--ok"], True),
    (["queue", "status", "--project", "proj"], True),
    (["queue", "list", "--project", "proj"], True),
    (["queue", "show", "--project", "proj", "j"], True),
    (["queue", "recover", "--project", "proj"], True),
    (["queue", "work", "--project", "proj", "--agent", "coder"], True),
    (["object", "check", "m.json"], True),
    (["object", "install", "m.json"], True),
    (["object", "list"], True),
    (["object", "which", "fs.read"], True),
    (["policy", "check", "p"], True),
    (["policy", "query", "--policy", "p", "s", "tool:t", "execute"], True),
    (["policy", "explain", "coder", "tool:t", "execute"], True),
    (["session", "list", "coder"], True),
    (["session", "show", "coder"], True),
    (["session", "tail", "coder"], True),
    (["session", "repair", "coder"], True),
    (["shared", "create", "space"], True),
    (["agent", "list"], True),
    (["agent", "show", "coder"], True),
    (["agent", "create", "-"], True),
    (["agent", "start", "coder"], True),
    (["agent", "stop", "coder"], True),
    (["agent", "watch", "coder"], False),
    (["agent", "attach", "coder"], False),
    (["man", "agent"], True),
    (["bootstrap"], True),
    (["tool", "tsh.config"], True),
    (["mount", "/nonexistent-mountpoint"], False),
    (["umount", "/nonexistent-mountpoint"], False),
    (["run", "--agent", "coder", "echo3"], False),
]


def _ids(cases):
    return [" ".join(words[:2]) for words, _ in cases]


@pytest.mark.parametrize(("words", "takes_json"), COMMANDS, ids=_ids(COMMANDS))
def test_an_unknown_option_is_exit_2_with_einval_and_the_json_object(world, words, takes_json):
    """An unknown option: 2, ``ctx: EINVAL: No such option``; with --json (even given after
    the unknown option) the error object on stdout, without it nothing there (README,
    docs/queue.md)."""
    # Options go before TOOL or NAME for ctx run and ctx tool (what follows is the tool's),
    # after the arguments elsewhere.
    place = len(words)
    if words[0] == "run":
        place = words.index("echo3")
    elif words[0] == "tool":
        place = 1
    extra = ["--json"] if takes_json else []
    r = world.ctx(*words[:place], "--no-such-option", *extra, *words[place:])
    assert_refusal(r, 2, "EINVAL", as_json=takes_json)
    assert "No such option" in r.err, r


def test_an_unknown_option_without_json_leaves_stdout_empty(world):
    for words in (["queue", "status"], ["policy", "check", "p"], ["agent", "list"], ["man"]):
        r = world.ctx(*words, "--no-such-option")
        assert_refusal(r, 2, "EINVAL", as_json=False)


MALFORMED = [
    ["queue", "claim", "--project", "proj", "--ttl", "abc"],
    ["queue", "claim", "--project", "proj", "--ttl", "-5"],
    ["queue", "claim", "--project", "proj", "--ttl", "1e400"],
    ["queue", "claim", "--project", "proj", "--pid", "0"],
    ["queue", "claim", "--project", "proj", "--pid", "12abc"],
    ["queue", "renew", "--project", "proj", "j", "--ttl", "nan"],
    ["queue", "recover", "--project", "proj", "--grace", "inf"],
    ["queue", "work", "--project", "proj", "--agent", "coder", "--max-jobs", "x"],
    ["queue", "work", "--project", "proj", "--agent", "coder", "--concurrency", "0"],
    ["queue", "list", "--project", "proj", "--state", "bogus"],
    ["queue", "status", "--project", "bad/name"],
    ["queue", "status", "--project"],
    ["queue", "show", "--project", "proj"],
    ["queue", "finish", "--project", "proj"],
    ["queue", "finish", "--project", "proj", "j"],
    ["queue", "work", "--project", "proj", "--agent", "a/b"],
    ["session", "tail", "coder", "-n", "-1"],
    ["session", "tail", "coder", "-n", "ten"],
    ["session", "list", "coder", "--uid", "4294967295"],
    ["session", "show", "bad/agent"],
    ["object", "install"],
    ["object", "list", "--tier", "bogus"],
    ["policy", "query", "s", "tool:t", "execute"],
    ["policy", "explain", "coder", "tool:t", "execute", "--peer", "abc"],
    ["policy", "explain", "coder", "bogus:t", "execute"],
    ["shared", "create", "bad/name"],
    ["shared", "create", "cortexfs-docs"],
    ["agent", "show"],
]


@pytest.mark.parametrize("words", MALFORMED, ids=[" ".join(w) for w in MALFORMED])
@pytest.mark.parametrize("as_json", [True], ids=["json"])
def test_a_bad_number_name_or_missing_argument_is_exit_2(world, words, as_json):
    """A malformed number, name or a missing argument or option value is a usage error:
    exit 2, ``EINVAL`` (docs/queue.md: "including a malformed name or number on the command
    line"; docs/sessions.md; P-8), with the error object under --json."""
    extra = ["--json"] if as_json else []
    # --json before the arguments: `--project` given last has no value.
    r = world.ctx(*words[:2], *extra, *words[2:])
    assert_refusal(r, 2, "EINVAL", as_json)


def test_a_bad_number_or_name_without_json_leaves_stdout_empty(world):
    for words in (MALFORMED[0], MALFORMED[10], MALFORMED[16], MALFORMED[21], MALFORMED[25]):
        assert_refusal(world.ctx(*words), 2, "EINVAL", as_json=False)


RUN_MALFORMED = [
    ["run", "--agent", "coder", "--timeout", "abc", "echo3"],
    ["run", "--agent", "coder", "--timeout", "99999999999", "echo3"],
    ["run", "--agent", "coder"],
    ["run", "echo3"],
    ["run", "--agent", "bad/name", "echo3"],
    ["run", "--nat", "--agent", "coder", "echo3"],
    ["mount", "--as", "bad/name", "EMPTY"],
]


@pytest.mark.parametrize("words", RUN_MALFORMED, ids=[" ".join(w) for w in RUN_MALFORMED])
def test_commands_without_json_refuse_a_malformed_line_with_2_and_nothing_on_stdout(world, words):
    """ctx run and ctx mount: a malformed line is exit 2 and ``ctx: EINVAL`` on stderr, before
    anything runs (docs/tools.md: "refused (exit 2) before anything runs")."""
    empty = world.top / "empty-mountpoint"
    empty.mkdir(exist_ok=True)
    r = world.ctx(*[str(empty) if word == "EMPTY" else word for word in words])
    assert_refusal(r, 2, "EINVAL", as_json=False)


# ---------------------------------------------------------------------------------------------
# 1: refusals, denials, conflicts

REFUSALS = [
    (["queue", "status", "--project", "nosuch"], "ENOENT"),
    (["queue", "show", "--project", "proj", "nosuch"], "ENOENT"),
    (["queue", "finish", "--project", "proj", "nosuch.req.json", "--ok", "REQ"], "ENOENT"),
    (["queue", "renew", "--project", "proj", "nosuch.req.json"], "ENOENT"),
    (["object", "which", "nosuch"], "ENOENT"),
    (["agent", "show", "nosuch"], "ENOENT"),
    (["agent", "stop", "coder"], "ENOENT"),
    (["agent", "create", "/nonexistent/request.json"], "ENOENT"),
    (["session", "show", "nosuch"], "ENOENT"),
    (["session", "tail", "coder", "nosuch"], "ENOENT"),
    (["man", "nosuch"], "ENOENT"),
    (["tool", "nosuch"], "ENOENT"),
    (["tool", "fs.write"], "EACCES"),
    (["tool", "shell.exec"], "EACCES"),
    (["object", "install", "--source", "ROOT", "FSREAD", "--tier", "system"], "EEXIST"),
]


def _fill(world: World, words: list[str]) -> list[str]:
    fsread = world.top / "fs.read.json"
    if not fsread.exists():
        (world.top / "fs.read.sh").write_text("#!/bin/sh\nexit 0\n")
        document = json.loads(world.manifest.read_text())
        document.update(name="fs.read", exec="fs.read.sh")
        fsread.write_text(json.dumps(document))
    table = {"REQ": str(world.request), "ROOT": str(world.storage), "FSREAD": str(fsread)}
    return [table.get(word, word) for word in words]


@pytest.mark.parametrize(
    ("words", "errno_name"), REFUSALS, ids=[" ".join(w[:3]) for w, _ in REFUSALS]
)
def test_a_refusal_is_exit_1_with_its_errno(world, words, errno_name):
    """The error object with --json, the ``ctx: ERRNO`` line on stderr, exit 1."""
    words = _fill(world, words)
    place = 1 if words[0] == "tool" else len(words)
    r = world.ctx(*words[:place], "--json", *words[place:])
    assert_refusal(r, 1, errno_name, as_json=True)


def test_a_refusal_without_json_leaves_stdout_empty(world):
    for words, errno_name in (REFUSALS[1], REFUSALS[4], REFUSALS[10], REFUSALS[12], REFUSALS[14]):
        assert_refusal(world.ctx(*_fill(world, words)), 1, errno_name, as_json=False)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_publishing_a_name_twice_and_creating_an_agent_twice_are_eexist_exit_1(world, as_json):
    """Q-1: a name with evidence is refused (EEXIST), never overwritten; an agent likewise."""
    extra = ["--json"] if as_json else []
    name = "twice-json" if as_json else "twice-text"
    first = world.ctx("queue", "publish", "--project", "proj", "--name", name, world.request)
    assert first.rc == 0, first
    again = world.ctx(
        "queue", "publish", "--project", "proj", "--name", name, *extra, world.request
    )
    assert_refusal(again, 1, "EEXIST", as_json)
    coder = world.ctx("agent", "create", "-", *extra, input=b'{"name": "coder", "label": "x_t"}')
    assert_refusal(coder, 1, "EEXIST", as_json)


def test_a_user_refused_by_the_mode_bits_gets_eacces_exit_1(
    world: World, unprivileged_user: UnprivilegedUser
):
    """Run as a user who is no member of the space's group, nor owner of the root: every
    write is refused with EACCES, exit 1, the object on stdout with --json."""
    env = {"PATH": "/usr/bin:/bin", "CTX_STORAGE": str(world.storage), "HOME": "/nonexistent"}
    cases = [
        ["queue", "publish", "--project", "proj", world.request],
        ["queue", "claim", "--project", "proj"],
        ["queue", "init", "--project", "theirs"],
        ["shared", "create", "theirs"],
        ["object", "install", "--source", world.storage, world.manifest, "--tier", "system"],
        ["bootstrap"],
    ]
    for index, words in enumerate(cases):
        for as_json in (index % 2 == 0,):
            r = run(
                [*CTX_ARGV, *words, *(["--json"] if as_json else [])],
                env,
                user=unprivileged_user.uid,
                group=unprivileged_user.gid,
                extra_groups=[],
            )
            assert_refusal(r, 1, "EACCES", as_json)


# ---------------------------------------------------------------------------------------------
# the queue's own statuses: 3 nothing to claim, 1 a conflict or incomplete pair


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_claim_on_an_empty_queue_is_exit_3_with_nothing_on_stdout(world, as_json):
    """§2.4: 3 nothing to claim; "on an empty queue claim prints nothing, with or without
    --json" (docs/queue.md)."""
    r = world.ctx("queue", "claim", "--project", "empty", *(["--json"] if as_json else []))
    assert r.rc == 3, r
    assert r.out == "" and r.errors() == [], r


def test_recover_and_status_exit_1_on_an_incomplete_pair_and_0_once_reconciled(world):
    """Q-6: plain recover reports an incomplete pair (exit 1) and changes nothing; status
    too finds it; --reconcile applies the transition and exits 0."""
    made = world.ctx("queue", "init", "--project", "pairs")
    assert made.rc == 0, made
    queue = world.storage / "shared" / "pairs" / "queue"
    (queue / "claimed" / "half.req.json").mkdir()
    (queue / "claimed" / "half.req.json" / "half.req.json").write_text(json.dumps(REQUEST))
    plain = world.ctx("queue", "recover", "--project", "pairs", "--json")
    assert plain.rc == 1 and plain.out and json.loads(plain.out)["consistent"] is False, plain
    assert (queue / "claimed" / "half.req.json" / "half.req.json").exists()
    fixed = world.ctx("queue", "recover", "--project", "pairs", "--reconcile")
    assert fixed.rc == 0, fixed
    assert (queue / "pending" / "half.req.json").exists()
    again = world.ctx("queue", "recover", "--project", "pairs")
    assert again.rc == 0, again


def test_status_list_and_show_exit_1_on_a_conflict(world):
    """docs/queue.md: "status, list and show exit 1 when they find (or list) a conflict"."""
    made = world.ctx("queue", "init", "--project", "conflict")
    assert made.rc == 0, made
    queue = world.storage / "shared" / "conflict" / "queue"
    for where in ("pending/both.req.json", "done/both.req.json"):
        (queue / where).write_text(json.dumps(REQUEST))
    (queue / "done" / "both.req.json.result").write_text(
        json.dumps({"status": "ok", "output": {}, "worker": {}, "started": "x", "finished": "y"})
    )
    for words in (["status"], ["list"], ["show", "both.req.json"]):
        r = world.ctx("queue", words[0], "--project", "conflict", *words[1:])
        assert r.rc == 1, r


# ---------------------------------------------------------------------------------------------
# policy (P-8)


def test_policy_query_check_and_explain_exit_with_their_verdicts(world):
    bad = world.top / "bad-policy"
    bad.write_text("allow coder_t tool:echo3 frobnicate\n")
    allow = world.ctx(
        "policy", "query", "--policy", world.policy, "coder_t", "tool:echo3", "execute"
    )
    assert (allow.rc, allow.out) == (0, "allow\n"), allow
    deny = world.ctx(
        "policy", "query", "--policy", world.policy, "coder_t", "tool:fs.write", "execute"
    )
    assert (deny.rc, deny.out) == (1, "deny\n"), deny
    malformed = world.ctx("policy", "query", "--policy", bad, "coder_t", "tool:echo3", "execute")
    assert malformed.rc == 2 and malformed.out == "", malformed
    assert "EINVAL" in malformed.err, malformed
    unknown_perm = world.ctx(
        "policy", "query", "--json", "--policy", world.policy, "s", "tool:x", "bogus"
    )
    assert_refusal(unknown_perm, 2, "EINVAL", as_json=True)
    valid = world.ctx("policy", "check", world.policy)
    assert (valid.rc, valid.out, valid.err) == (0, "", ""), valid
    invalid = world.ctx("policy", "check", bad)
    assert invalid.rc == 1, invalid
    assert re.search(r"^.*bad-policy:1: EINVAL: ", invalid.err, re.M), invalid
    allowed = world.ctx("policy", "explain", "coder", "tool:echo3", "execute")
    assert allowed.rc == 0 and allowed.out, allowed
    denied = world.ctx("policy", "explain", "coder", "tool:fs.write", "execute")
    assert denied.rc == 1 and denied.out, denied


# ---------------------------------------------------------------------------------------------
# ctx run (T-3): the tool's status, 126 refused, 127 not found; native 0/1/2


def test_ctx_run_exit_statuses_in_terminal_mode(world):
    ran = world.ctx("run", "--agent", "coder", "echo3", "a", "b")
    assert (ran.rc, ran.out) == (3, "hello a b\n"), ran
    refused = world.ctx("run", "--agent", "coder", "fs.write", "{}")
    assert refused.rc == 126 and ("ctx", "EACCES") in refused.errors(), refused
    missing = world.ctx("run", "--agent", "coder", "no.such.tool")
    assert missing.rc == 127 and ("ctx", "ENOENT") in missing.errors(), missing
    no_agent = world.ctx("run", "--agent", "nobody-here", "echo3")
    assert no_agent.rc == 126 and ("ctx", "ENOENT") in no_agent.errors(), no_agent
    assert "ctx agent list" in no_agent.err, no_agent


def _frames(r: Raw) -> list[dict]:
    return [json.loads(line) for line in r.out.splitlines()]


def test_ctx_run_native_exits_0_1_or_2_with_a_result_frame_last(world):
    """docs/tools.md: 0 when the result is ok, 2 when the input is not JSON or fails the
    schema, 1 otherwise."""
    ok = world.ctx("tool", "--json", "tsh.config")
    assert ok.rc == 0, ok
    failed = world.ctx("run", "--native", "--agent", "coder", "echo3", input=b"{}")
    assert failed.rc == 1 and _frames(failed)[-1]["type"] == "result", failed
    assert _frames(failed)[-1]["exit_status"] == 3, failed
    not_json = world.ctx("run", "--native", "--agent", "coder", "echo3", input=b"nope")
    assert not_json.rc == 2, not_json
    assert _frames(not_json)[-1]["error"]["error"] == "EINVAL", not_json
    missing = world.ctx("run", "--native", "--agent", "coder", "no.such.tool", input=b"{}")
    assert missing.rc == 1 and _frames(missing)[-1]["error"]["error"] == "ENOENT", missing


def test_ctx_run_native_output_lost_is_74_or_141(world):
    """docs/tools.md: frames that cannot be written: 74 with ``ctx: ENOSPC: cannot write
    standard output`` and what became of the call; a reader that left: 141, quietly; closed
    at start: nothing run."""
    full = world.ctx("run", "--native", "--agent", "coder", "echo3", input=b"{}", output="full")
    assert full.rc == EXIT_OUTPUT_FAILED and ("ctx", "ENOSPC") in full.errors(), full
    assert "cannot write standard output" in full.err and "recorded" in full.err, full
    gone = world.ctx("run", "--native", "--agent", "coder", "echo3", input=b"{}", output="gone")
    assert gone.rc == EXIT_READER_GONE and gone.errors() == [], gone
    closed = world.ctx("run", "--native", "--agent", "coder", "echo3", input=b"{}", output="closed")
    assert closed.rc == EXIT_OUTPUT_FAILED and ("ctx", "EBADF") in closed.errors(), closed
    assert "nothing was run" in closed.err, closed


def test_ctx_run_terminal_mode_keeps_the_tools_own_status_whatever_its_output(world):
    """What the tool cannot write on the stdout it was lent is its own business and shows in
    its own status (docs/tools.md): exit 3 to /dev/full and closed; a shell tool that SIGPIPE
    ended: 128 + 13."""
    for output in ("full", "closed"):
        r = world.ctx("run", "--agent", "coder", "echo3", "x", output=output)
        assert r.rc == 3, r
    gone = world.ctx("run", "--agent", "coder", "echo3", "x", output="gone")
    assert gone.rc == 128 + signal.SIGPIPE, gone


# ---------------------------------------------------------------------------------------------
# output lost: 74 (full), 141 (reader gone), closed (0, or EBADF for a queue answer)

SUCCESSES = [
    (["queue", "status", "--project", "proj"], True),
    (["queue", "list", "--project", "proj"], True),
    (["queue", "recover", "--project", "proj"], True),
    (["queue", "init", "--project", "proj"], False),
    (["object", "list"], True),
    (["object", "which", "fs.read"], False),
    (["object", "check", "MANIFEST"], True),
    (["policy", "query", "--policy", "POLICY", "coder_t", "tool:echo3", "execute"], True),
    (["policy", "explain", "coder", "tool:echo3", "execute"], False),
    (["agent", "show", "coder"], True),
    (["man", "agent"], False),
    (["man"], True),
    (["shared", "create", "proj"], True),
    (["tool", "tsh.config"], False),
    (["session", "list", "coder"], True),
    (["--version"], False),
    (["queue", "--help"], False),
    (["run", "--help"], False),
]


def _sub(world: World, words: list[str]) -> list[str]:
    table = {"MANIFEST": str(world.manifest), "POLICY": str(world.policy)}
    return [table.get(word, word) for word in words]


@pytest.mark.parametrize(("words", "as_json"), SUCCESSES, ids=_ids(SUCCESSES))
def test_an_output_that_cannot_be_written_is_74_and_a_reader_gone_141(world, words, as_json):
    """README and docs/queue.md: ``> /dev/full`` ends a command with ``ctx: ENOSPC: cannot
    write standard output (…)`` and 74; a reader that left with 141 and no word; never 1."""
    argv = [*_sub(world, words), *(["--json"] if as_json else [])]
    full = world.ctx(*argv, output="full")
    assert full.rc == EXIT_OUTPUT_FAILED, full
    assert full.errors() == [("ctx", "ENOSPC")], full
    assert "cannot write standard output" in full.err, full
    assert "Traceback" not in full.err, full
    gone = world.ctx(*argv, output="gone")
    assert gone.rc == EXIT_READER_GONE and gone.err == "", gone


@pytest.mark.parametrize(
    "words",
    [
        ["queue", "status", "--project", "proj"],
        ["queue", "recover", "--project", "proj"],
        ["queue", "init", "--project", "proj"],
        ["queue", "list", "--project", "proj"],
    ],
    ids=["status", "recover", "init", "list"],
)
def test_a_closed_stdout_runs_a_queue_reader_in_text_and_refuses_its_json(world, words):
    """docs/queue.md: started with standard output closed, every command given --json exits
    1 with EBADF before anything is done; the other commands run as usual."""
    text = world.ctx(*words, output="closed")
    assert (text.rc, text.err) == (0, ""), text
    with_json = world.ctx(*words, "--json", output="closed")
    assert with_json.rc == 1 and with_json.errors() == [("ctx", "EBADF")], with_json


def test_a_closed_stdout_outside_the_queue_is_output_the_caller_dropped(world):
    """The EBADF rule of docs/queue.md names the queue commands; the others, --json or not,
    run with their output going nowhere, as the caller asked, and report success."""
    for words in (["object", "list", "--json"], ["agent", "list", "--json"], ["man", "--json"]):
        r = world.ctx(*words, output="closed")
        assert (r.rc, r.err) == (0, ""), r


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_publish_and_claim_with_stdout_closed_do_nothing_and_exit_1_ebadf(world, as_json):
    """docs/queue.md: publish and claim refuse to start without the output their answer goes
    to: exit 1, EBADF, nothing published or claimed."""
    made = world.ctx("queue", "init", "--project", f"closed{int(as_json)}")
    assert made.rc == 0, made
    project = f"closed{int(as_json)}"
    queue = world.storage / "shared" / project / "queue"
    extra = ["--json"] if as_json else []
    published = world.ctx(
        "queue", "publish", "--project", project, *extra, world.request, output="closed"
    )
    assert published.rc == 1 and published.errors() == [("ctx", "EBADF")], published
    assert os.listdir(queue / "pending") == []
    ok = world.ctx("queue", "publish", "--project", project, world.request)
    assert ok.rc == 0, ok
    claimed = world.ctx("queue", "claim", "--project", project, *extra, output="closed")
    assert claimed.rc == 1 and claimed.errors() == [("ctx", "EBADF")], claimed
    assert os.listdir(queue / "pending") == [ok.out.strip()]
    assert os.listdir(queue / "claimed") == []


def test_publish_and_claim_to_dev_full_say_what_they_did_and_exit_74(world):
    """docs/queue.md: "a command that had already changed something says so on the same
    line": J published and pending, or claimed and leased to whom."""
    project = "fullq"
    assert world.ctx("queue", "init", "--project", project).rc == 0
    pub = world.ctx("queue", "publish", "--project", project, world.request, output="full")
    assert pub.rc == EXIT_OUTPUT_FAILED and pub.errors() == [("ctx", "ENOSPC")], pub
    pending = os.listdir(world.storage / "shared" / project / "queue" / "pending")
    assert len(pending) == 1 and pending[0] in pub.err and "do not publish again" in pub.err
    holder = subprocess.Popen(["sleep", "60"])
    try:
        claim = world.ctx(
            "queue", "claim", "--project", project, "--pid", holder.pid, output="full"
        )
        assert claim.rc == EXIT_OUTPUT_FAILED, claim
        assert pending[0] in claim.err and f"pid {holder.pid}" in claim.err, claim
    finally:
        holder.kill()
        holder.wait()


def test_claim_to_a_reader_that_left_is_141_with_a_note_naming_the_job(world):
    """docs/queue.md: only claim says a word first, since its job stays leased."""
    project = "goneq"
    assert world.ctx("queue", "init", "--project", project).rc == 0
    pub = world.ctx("queue", "publish", "--project", project, world.request)
    assert pub.rc == 0, pub
    claim = world.ctx("queue", "claim", "--project", project, "--pid", os.getpid(), output="gone")
    assert claim.rc == EXIT_READER_GONE, claim
    assert "ctx: note: the reader of standard output left" in claim.err, claim
    assert pub.out.strip() in claim.err, claim


ERRORS_WITH_OUTPUT_LOST = [
    (["queue", "show", "--project", "proj", "nosuch"], 1),
    (["object", "which", "nosuch"], 1),
    (["man", "nosuch"], 1),
    (["queue", "status", "--project", "bad/name"], 2),
    (["queue", "claim", "--project", "proj", "--ttl", "abc"], 2),
    (["object", "list", "--tier", "bogus"], 2),
    (["shared", "create", "bad/name"], 2),
    (["policy", "explain", "coder", "bogus:t", "execute"], 2),
]


@pytest.mark.parametrize(
    ("words", "status"),
    ERRORS_WITH_OUTPUT_LOST,
    ids=[" ".join(w[:3]) for w, _ in ERRORS_WITH_OUTPUT_LOST],
)
@pytest.mark.parametrize("output", ["full", "gone", "closed"])
def test_an_error_keeps_its_status_when_its_json_object_cannot_be_written(
    world, words, status, output
):
    """The ``ctx: ERRNO`` line on stderr has said it all: the exit status is still the
    error's (1 refused, 2 malformed, "A usage error stays exit 2"), not 74 or 141."""
    r = world.ctx(*words, "--json", output=output)
    assert r.rc == status, r
    if not (output == "closed" and words[0] == "queue" and status == 1):
        assert r.errors() and r.errors()[0][1] in ("ENOENT", "EINVAL", "EACCES"), r


@pytest.mark.parametrize("output", ["full", "gone"])
def test_a_malformed_policy_query_stays_exit_2_when_its_json_object_cannot_be_written(
    world, output
):
    """P-8: a malformed query or policy is exit 2 with EINVAL; every other command keeps its
    error's status when the error object cannot be written (above)."""
    r = world.ctx(
        "policy", "query", "--json", "--policy", world.policy, "s", "tool:x", "bogus",
        output=output,
    )  # fmt: skip
    assert ("ctx", "EINVAL") in r.errors(), r
    assert r.rc == 2, r


# ---------------------------------------------------------------------------------------------
# 130 after Ctrl-C; signals that end a long-running command cleanly


def _reading_stdin(pid: int) -> bool:
    """Whether ``pid`` is blocked in read(2) on descriptor 0 (x86-64 and arm64 numbers)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] in ("0", "63") and fields[1] == "0x0"


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="syscall numbers")
@pytest.mark.parametrize(
    "words",
    [
        ["queue", "publish", "--project", "proj", "-"],
        ["queue", "publish", "--project", "proj", "--json", "-"],
        ["policy", "check", "-"],
        ["agent", "create", "-"],
    ],
    ids=["publish", "publish-json", "policy-check", "agent-create"],
)
def test_ctrl_c_while_reading_standard_input_is_130_with_eintr(world, words):
    """README: 130 after Ctrl-C; docs/queue.md: ``ctx: EINTR: …``, and with --json the
    object too; nothing published."""
    pending = world.storage / "shared" / "proj" / "queue" / "pending"
    before = set(os.listdir(pending))
    proc = subprocess.Popen(
        [*CTX_ARGV, *words], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=world.env,
    )  # fmt: skip
    try:
        assert wait_for(lambda: _reading_stdin(proc.pid), 20), "never read standard input"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = Raw(words, proc.returncode, out.decode(), err.decode())
    assert_refusal(r, 128 + signal.SIGINT, "EINTR", as_json="--json" in words)
    assert set(os.listdir(pending)) == before


def test_session_tail_follow_ends_with_0_on_ctrl_c(world):
    """docs/sessions.md: tail --follow runs until Ctrl-C, which ends it with exit 0."""
    ran = world.ctx("run", "--agent", "coder", "echo3")
    assert ran.rc == 3, ran
    proc = subprocess.Popen(
        [*CTX_ARGV, "session", "tail", "coder", "--follow", "-n", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
    )  # fmt: skip
    try:
        assert proc.stdout.readline(), "tail printed no event"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_waiting_worker_stopped_by_a_signal_exits_0(world, signum):
    """docs/workers.md: SIGTERM, SIGHUP or a first ^C: stop claiming; exit 0; the stop
    event names the signal."""
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "empty", "--agent", "coder", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
    )  # fmt: skip
    try:
        start = json.loads(proc.stdout.readline())
        assert start["event"] == "start", start
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    stop = json.loads(out.decode().splitlines()[-1])
    assert stop["event"] == "stop" and stop["stopped_by"] == signal.Signals(signum).name, out


def test_a_worker_whose_output_fails_exits_74_or_141(world):
    """docs/workers.md: "/dev/full: exits 74 … a reader that left … exit 141.  Never exit 1"."""
    argv = ["queue", "work", "--project", "empty", "--agent", "coder", "--drain", "--json"]
    full = world.ctx(*argv, output="full")
    assert full.rc == EXIT_OUTPUT_FAILED and ("ctx", "ENOSPC") in full.errors(), full
    assert "the worker stopped claiming jobs" in full.err, full
    gone = world.ctx(*argv, output="gone")
    assert gone.rc == EXIT_READER_GONE, gone
    drained = world.ctx(*argv)
    assert drained.rc == 0, drained


# ---------------------------------------------------------------------------------------------
# ctx mount / umount (F-1, docs/mount.md)


def test_mount_refusals_are_exit_1_with_their_errno(world):
    scratch = new_scratch_dir(scratch_top(__file__), "mnt")
    try:
        (scratch / "full").mkdir()
        (scratch / "full" / "x").write_text("")
        (scratch / "empty").mkdir()
        cases = [
            (["mount", scratch / "missing"], "ENOENT"),
            (["mount", scratch / "full"], "ENOTEMPTY"),
            (["mount", scratch / "full" / "x"], "ENOTDIR"),
            (["mount", "--storage", scratch / "no-root", scratch / "empty"], "ENOENT"),
            (["mount", "--as", "nobody-here", scratch / "empty"], "ENOENT"),
            (["umount", scratch / "empty"], "EINVAL"),
        ]
        for words, errno_name in cases:
            r = world.ctx(*words)
            assert_refusal(r, 1, errno_name, as_json=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@needs_fuse_as_root
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_mount_ended_by_a_signal_unmounts_and_exits_0(world, signum):
    """docs/mount.md: until SIGTERM, SIGINT or SIGHUP; either way it unmounts cleanly and
    exits 0."""
    scratch = new_scratch_dir(scratch_top(__file__), "sig")
    where = scratch / "ctx"
    where.mkdir()
    try:
        with serving(world.storage, where) as mount:
            mount.proc.send_signal(signum)
            mount.proc.wait(timeout=30)
            assert mount.proc.returncode == 0, mount.said()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# tsh (docs/tools.md) and ctxmcp (M-1)


def test_tsh_exit_statuses(world):
    """``exit N`` modulo 256; a built-in used wrongly 2; not a tool 127; a tool a standalone
    tsh may not run 126 (H-2); a name not on CTX_PATH 1 for which."""
    assert world.tsh("exit", "7").rc == 7
    assert world.tsh("exit", "300").rc == 300 % 256
    assert world.tsh(input=b"exit 5\n").rc == 5
    wrong = world.tsh("which")
    assert wrong.rc == 2 and "tsh: which:" in wrong.err, wrong
    assert world.tsh("help", "extra").rc == 2
    not_a_tool = world.tsh("ls")
    assert not_a_tool.rc == 127 and "not a tool on CTX_PATH" in not_a_tool.err, not_a_tool
    refused = world.tsh("fs.read", "{}")
    assert refused.rc == 126 and "EACCES" in refused.err, refused
    assert world.tsh("which", "no.such.tool").rc == 1


@pytest.mark.parametrize("words", [["help"], ["tools"]], ids=["help", "tools"])
def test_tsh_output_lost_is_74_or_141(world, words):
    full = world.tsh(*words, output="full")
    assert full.rc == EXIT_OUTPUT_FAILED and ("tsh", "ENOSPC") in full.errors(), full
    gone = world.tsh(*words, output="gone")
    assert gone.rc == EXIT_READER_GONE and gone.err == "", gone
    closed = world.tsh(*words, output="closed")
    assert closed.rc == 0, closed


def test_ctxmcp_exit_statuses(world):
    """docs/tools.md (ctxmcp): 2 a configuration or server name that cannot be used, with
    the error object under --json; 74 an output that cannot be written."""
    unknown = run([CTXMCP, "list", "--json", "--no-such-option"], world.env)
    assert_refusal(unknown, 2, "EINVAL", as_json=True, program="ctxmcp")
    dotted = run(
        [CTXMCP, "list", "--config", world.top / "none.json", "--server", "a.b", "--json"],
        world.env,
    )
    assert_refusal(dotted, 2, "EINVAL", as_json=True, program="ctxmcp")
    missing = run([CTXMCP, "list", "--config", world.top / "none.json", "--server", "a"], world.env)
    assert missing.rc == 2 and ("ctxmcp", "ENOENT") in missing.errors(), missing
    full = run([CTXMCP, "--help"], world.env, "full")
    assert full.rc == EXIT_OUTPUT_FAILED and ("ctxmcp", "ENOSPC") in full.errors(), full
    gone = run([CTXMCP, "--help"], world.env, "gone")
    assert gone.rc == EXIT_READER_GONE, gone
