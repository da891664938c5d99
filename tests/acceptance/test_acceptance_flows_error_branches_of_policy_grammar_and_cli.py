"""The error branches of the policy v0 grammar and of ``ctx policy check``, ``query`` and
``explain``, each reached from outside as a demanding administrator reaches it (SPEC §5 P-1,
P-2, P-3, P-4, P-5, P-6, P-7, P-8; §1 R-3; docs/policy.md "The language", "Classes and
permissions", "Validity and decisions", "What the chain reads", "Commands", "Errors you will
see"; ``ctx policy check --help``, ``ctx policy query --help``, ``ctx policy explain --help``).

The angle: the word-by-word reader of a rule line and the command line around it, branch by
branch — statements that are not ``allow`` (``include`` and its lookalikes, a capitalised
``Deny``), a ``#include`` that is only a comment and pulls nothing in, a bare ``allow``, the
empty parts of an object (``tool:``, ``:x``, ``model:a/``), a path where a model is expected,
punctuation glued to the permission; policy FILEs the kernel refuses to read for reasons
other than a missing file (a loop of links, a path through a file, a read that fails with
EIO), file names holding a line break or an escape, Ctrl-C while a policy is read from a
pipe; arguments far past the length of a name; an absolute ``--location`` that is refused;
``--storage`` that is a file or not there (and the repair the message names); and the chain
reading a policy it may not read as the agent's own uid, a tool control directory that is a
symbolic link, and a policy made immutable.

Each check reads the exit status (check: 0 valid, 1 invalid or unreadable; query: 0 allow,
1 deny, 2 malformed; explain: 0, 1, 2), the errno word of the ``FILE:LINE: EINVAL:``,
``FILE: ERRNO:`` or ``ctx: ERRNO:`` line and of the ``--json`` object, that the message names
the file, line, word or step at fault, that no traceback is printed, and that nothing is
changed: ``check``, ``query`` and ``explain`` read and write nothing else, and a link is never
followed to a policy that would allow."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.support.storage import attribute, copy_of_root

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback"
RULE = "allow coder_t tool:fs.read execute"
SHAPE = "every rule has the form 'allow SUBJECT CLASS:NAME PERMISSION'"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids")


# ---------------------------------------------------------------------------------- helpers


def ctx(*args: str | os.PathLike, **kw) -> Run:
    kw.setdefault("env", clean_env())
    return ctx_run(*args, **kw)


def no_traceback(run: Run) -> None:
    assert TRACEBACK not in run.err and "Fatal Python error" not in run.err, run


def checked(path: Path) -> tuple[Run, Run]:
    """``ctx policy check FILE`` and ``ctx policy check --json FILE``."""
    text, as_json = ctx("policy", "check", path), ctx("policy", "check", "--json", path)
    no_traceback(text)
    no_traceback(as_json)
    return text, as_json


def problems_of(as_json: Run) -> list[dict]:
    [report] = as_json.json()["files"]
    return report["problems"]


def queried(*layers: Path, rule: tuple[str, str, str] = ("coder_t", "tool:fs.read", "execute"),
            as_json: bool = False) -> Run:  # fmt: skip
    options = [word for layer in layers for word in ("--policy", str(layer))]
    run = ctx("policy", "query", *(["--json"] if as_json else []), *options, *rule)
    no_traceback(run)
    return run


@pytest.fixture
def desk() -> Iterator[Path]:
    """A scratch directory of the files a test writes (no storage root needed)."""
    top = new_scratch_dir(SCRATCH, "desk-")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o644)
    return path


# ======================================================= statements that are not 'allow'

NOT_ALLOW = [  # (line, the words its problem holds)
    (b"include other.policy", "unknown statement 'include'"),
    (b"@include other.policy", "unknown statement '@include'"),
    (b".include other.policy", "unknown statement '.include'"),
    (b"!include other.policy", "unknown statement '!include'"),
    (b"source other.policy", "unknown statement 'source'"),
    (b"Deny coder_t tool:fs.read execute", "unknown statement 'Deny'"),
    (b"allow", "incomplete rule: the subject type is missing"),
    (b"allow coder_t", "incomplete rule: the CLASS:NAME object is missing"),
]


def test_each_statement_that_is_not_allow_is_named_by_line_with_the_shape_of_a_rule(desk):
    """P-1, P-2, P-8 (docs/policy.md "The language": a rule line is exactly four words
    beginning with ``allow``; there is nothing else, no ``deny`` and no inclusion): each of
    ``include``, ``@include``, ``.include``, ``!include``, ``source``, a capitalised ``Deny``,
    a bare ``allow`` and an ``allow`` with only its subject is reported on its own line as
    ``FILE:LINE: EINVAL: …`` naming the word and the shape a rule has (or the word that is
    missing), every one of them (exit 1; ``--json`` the same lines, in order); the rule on the
    first line is not enough to make the file valid; the file is unchanged."""
    body = RULE.encode() + b"\n" + b"\n".join(line for line, _ in NOT_ALLOW) + b"\n"
    policy = written(desk / "statements.policy", body)
    text, as_json = checked(policy)
    assert (text.rc, text.out, as_json.rc) == (1, "", 1), text
    lines = text.err.splitlines()
    assert len(lines) == len(NOT_ALLOW), text
    for number, (shown, (_, words)) in enumerate(zip(lines, NOT_ALLOW, strict=True), start=2):
        assert shown.startswith(f"{policy}:{number}: EINVAL: {words}"), (shown, words)
        assert SHAPE in shown or "expected 'allow SUBJECT CLASS:NAME PERMISSION'" in shown, shown
    found = problems_of(as_json)
    assert [(p["line"], p["error"], p["errno"]) for p in found] == [
        (n, "EINVAL", 22) for n in range(2, len(NOT_ALLOW) + 2)
    ], as_json
    assert as_json.json()["valid"] is False
    assert policy.read_bytes() == body


def test_a_hash_include_is_a_comment_and_pulls_in_nothing_of_the_file_it_names(desk):
    """P-1 (a line whose first non-blank character is ``#`` is ignored), P-2 (no inheritance,
    no templates), P-8: ``#include granted.policy`` and ``# include granted.policy`` are
    comments: the file holding only them is valid (exit 0) and grants nothing — ``query``
    denies (exit 1) a rule that only ``granted.policy`` holds — while ``granted.policy`` alone
    allows it; neither file is changed."""
    granted = written(desk / "granted.policy", f"{RULE}\n".encode())
    including = written(
        desk / "including.policy",
        b"#include granted.policy\n  # include granted.policy\n\t#include "
        + os.fsencode(granted)
        + b"\n",
    )
    text, as_json = checked(including)
    assert (text.rc, text.err, as_json.json()["valid"]) == (0, "", True), text
    denied = queried(including, as_json=True)
    assert denied.rc == 1 and denied.json() == {
        "decision": "deny",
        "rule": RULE,
        "policies": [{"policy": str(including), "allows": False}],
    }, denied
    assert (queried(granted).rc, queried(granted).out) == (0, "allow\n")
    both = queried(granted, including)
    assert (both.rc, both.out) == (1, "deny\n"), both


# ================================================================ the parts of an object

OBJECT_PARTS = {  # rule line: the words its problem holds
    "allow coder_t tool: execute": "tool:: a name must not be empty",
    "allow coder_t model:acme/ use": "model:acme/: a name must not be empty",
    "allow coder_t model:/m1 use": "model:/m1: a name must not be empty",
    "allow coder_t :fs.read execute": "unknown class ''; the classes are tool, model, shared",
    "allow coder_t model:/ctx/model/acme/m1 use": "a model name is <provider>/<model>",
    "allow coder_t model:acme/m1/v2 use": "model:acme/m1/v2: a model name is <provider>/<model>",
    "allow coder_t tool:bin/fs.read execute": "tool:bin/fs.read: paths are not supported (P-2)",
    "allow coder_t shared:.hidden read": "'.hidden' must start with a letter or digit, not '.'",
    "allow coder_t tool:fs.read execute;": "unknown permission 'execute;'; tool has execute",
    "allow coder_t tool:fs.read:v2 execute": "holds ':', which an object name may not hold",
    "allow coder_t network:Default connect": "network:Default: the only network object is",
}


@pytest.mark.parametrize("line", sorted(OBJECT_PARTS))
def test_an_object_with_an_empty_or_extra_part_is_einval_in_check_and_query(desk, line):
    """P-3, P-4, P-7, R-3 (docs/policy.md "Classes and permissions": an object name is 1–64
    bytes, a model ``<provider>/<model>``, the only network object ``default``): a rule whose
    object has an empty name, an empty provider or model, an empty class, too many parts, a
    path, a name starting with a dot, a second colon, or a permission with a semicolon glued
    to it is named by ``check`` (exit 1, one line, the object quoted); as a query of the same
    three words it is malformed (exit 2, ``ctx: EINVAL:`` with the same reason, no answer on
    stdout, the error object with ``--json``)."""
    policy = written(desk / "object.policy", f"{RULE}\n{line}\n".encode())
    text, as_json = checked(policy)
    words = OBJECT_PARTS[line]
    assert text.rc == 1 and text.err.startswith(f"{policy}:2: EINVAL: "), text
    assert words in text.err and len(text.err.splitlines()) == 1, text
    [problem] = problems_of(as_json)
    assert (problem["line"], problem["error"]) == (2, "EINVAL") and words in problem["message"]
    _, subject, obj, perm = line.split()
    good = written(desk / "good.policy", f"{RULE}\n".encode())
    asked = queried(good, rule=(subject, obj, perm))
    assert (asked.rc, asked.out) == (2, "") and asked.err.startswith("ctx: EINVAL: "), asked
    assert words in asked.err, asked
    as_json_query = queried(good, rule=(subject, obj, perm), as_json=True)
    error = as_json_query.json()
    assert as_json_query.rc == 2 and (error["error"], error["errno"]) == ("EINVAL", 22)
    assert words in error["message"], error


def test_a_policy_of_several_faulty_layers_names_the_first_and_counts_the_rest(desk):
    """P-8 (docs/policy.md "Validity and decisions": the checker reports every invalid line;
    ``query``: a malformed policy is exit 2 with EINVAL): ``query`` given a valid layer and
    then a layer of three bad lines prints each bad line as ``FILE:LINE: EINVAL:``, no
    answer, exit 2; its ``--json`` error object names the first and counts the two others;
    the later layers (a file that does not exist) are not what it reports."""
    good = written(desk / "good.policy", f"{RULE}\n".encode())
    bad = written(desk / "bad.policy", b"include x\n# c\nallow coder_t tool: execute\nallow\n")
    missing = desk / "missing.policy"
    text = queried(good, bad, missing)
    assert (text.rc, text.out) == (2, ""), text
    assert [line.split(": EINVAL: ")[0] for line in text.err.splitlines()] == [
        f"{bad}:1",
        f"{bad}:3",
        f"{bad}:4",
    ], text
    assert "ENOENT" not in text.err, text
    error = queried(good, bad, missing, as_json=True).json()
    assert error["error"] == "EINVAL", error
    assert error["message"].startswith(f"{bad}:1: unknown statement 'include'"), error
    assert error["message"].endswith("(and 2 more invalid lines)"), error
    assert not missing.exists()


# ============================================================ policy FILEs that cannot be read


def _loop(desk: Path) -> tuple[Path, str, str]:
    (desk / "loop-b").symlink_to("loop-a")
    (desk / "loop-a").symlink_to("loop-b")
    return desk / "loop-a", "ELOOP", "Too many levels of symbolic links"


def _through_a_file(desk: Path) -> tuple[Path, str, str]:
    written(desk / "plain.policy", f"{RULE}\n".encode())
    return desk / "plain.policy" / "policy", "ENOTDIR", "Not a directory"


def _dangling(desk: Path) -> tuple[Path, str, str]:
    (desk / "dangling.policy").symlink_to(desk / "gone.policy")
    return desk / "dangling.policy", "ENOENT", "No such file or directory"


def _read_fails(desk: Path) -> tuple[Path, str, str]:
    # A regular file whose read the kernel refuses: the process's own memory at offset 0.
    return Path("/proc/self/mem"), "EIO", "Input/output error"


UNREADABLE = {
    "a loop of links": _loop,
    "a path through a file": _through_a_file,
    "a link to nothing": _dangling,
    "a file whose read fails": _read_fails,
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_policy_file_the_kernel_will_not_read_is_named_with_its_errno(desk, case):
    """P-8 (docs/policy.md "Commands": check exits 1 for a file that is invalid or
    unreadable, with ``line: null`` in ``--json``; ``query --help``: a --policy FILE that
    cannot be read exits 2 with its errno): a loop of links (ELOOP), a path through a
    regular file (ENOTDIR), a link to nothing (ENOENT) and a regular file whose read fails
    (EIO) are each one ``FILE: ERRNO: cannot read FILE: …`` line from ``check`` (exit 1; the
    valid file given with it is still judged and says nothing), and ``ctx: ERRNO: …`` from
    ``query`` (exit 2, no answer; the error object with ``--json``); nothing is made at the
    path."""
    path, errno_name, strerror = UNREADABLE[case](desk)
    good = written(desk / "good.policy", f"{RULE}\n".encode())
    before = snapshot(desk)
    run = ctx("policy", "check", "--json", path, good)
    no_traceback(run)
    said = f"cannot read {path}: {strerror}"
    assert (run.rc, run.err) == (1, f"{path}: {errno_name}: {said}\n"), run
    report = run.json()
    assert report["valid"] is False, report
    assert [f["valid"] for f in report["files"]] == [False, True], report
    [problem] = report["files"][0]["problems"]
    assert (problem["line"], problem["error"], problem["message"]) == (None, errno_name, said)
    asked = queried(path)
    assert (asked.rc, asked.out, asked.err) == (2, "", f"ctx: {errno_name}: {said}\n"), asked
    error = queried(good, path, as_json=True).json()
    assert (error["error"], error["message"]) == (errno_name, said), error
    assert snapshot(desk) == before


def test_file_names_with_a_line_break_or_an_escape_are_escaped_on_stderr_and_exact_in_json(desk):
    """P-8, docs/policy.md "Commands" (one line per invalid line on stderr; ``--json`` names
    each ``file``): a policy FILE whose name holds a line break or a terminal escape is named
    on stderr with those bytes escaped (``\\x0a``, ``\\x1b``), so each report stays one line
    that cannot rewrite the screen, and in ``--json`` by its exact name; ``query`` names it
    the same way."""
    for name in ("two\nlines.policy", "\x1b[2Jwiped.policy"):
        policy = written(desk / name, b"allow coder_t tool:* execute\n")
        run = ctx("policy", "check", "--json", policy)
        no_traceback(run)
        shown = str(policy).replace("\n", "\\x0a").replace("\x1b", "\\x1b")
        assert run.rc == 1 and run.err == (
            f"{shown}:1: EINVAL: tool:*: globs are not supported (P-2); name each object\n"
        ), run
        assert run.json()["files"][0]["file"] == str(policy), run
        asked = queried(policy)
        assert asked.rc == 2 and asked.err.startswith(f"{shown}:1: EINVAL: "), asked
        assert "\x1b" not in asked.err and asked.err.count("\n") == 1, asked


@pytest.mark.parametrize("argv", [["check", "-"], ["query", "--json", "--policy", "-"]])
def test_ctrl_c_while_a_policy_is_read_from_a_pipe_ends_with_eintr_and_130(argv):
    """P-8 and the exit statuses of every command (docs/queue.md: a command Ctrl-C stopped
    says ``ctx: EINTR: …`` and exits 128 + 2; with ``--json`` the error object): ``check -``
    and ``query --policy -`` waiting on a pipe whose writer keeps it open are interrupted by
    SIGINT: EINTR on stderr, no traceback, no verdict (no ``allow``/``deny``), exit 130."""
    if argv[0] == "query":
        argv = [*argv, "coder_t", "tool:fs.read", "execute"]
    reader, writer = os.pipe()
    try:
        os.write(writer, f"{RULE}\n".encode())
        proc = subprocess.Popen(
            [*CTX_ARGV, "policy", *argv],
            stdin=reader,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(),
        )
        os.close(reader)
        reader = -1
        time.sleep(1.5)  # the pipe is read and the command waits for its end
        assert proc.poll() is None, "the command ended before the pipe did"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if reader >= 0:
            os.close(reader)
        os.close(writer)
    text = err.decode()
    assert proc.returncode == 130, (proc.returncode, out, text)
    assert "ctx: EINTR: interrupted (SIGINT)" in text and TRACEBACK not in text, text
    assert b"allow" not in out and b"deny" not in out, out
    if "--json" in argv:
        assert json.loads(out)["error"] == "EINTR", out


# ============================================================ arguments past a name's length

WIDE = "".join(chr(0x4E00 + n) for n in range(5000))  # 5000 different CJK characters


@pytest.mark.parametrize(
    "args",
    [
        ["query", "--policy", "POLICY", f"a{WIDE}", "tool:fs.read", "execute"],
        ["query", "--policy", "POLICY", "coder_t", f"tool:x{WIDE}", "execute"],
        ["explain", f"a{WIDE}", "tool:fs.read", "execute"],
    ],
    ids=["query-subject", "query-object", "explain-agent"],
)
def test_a_name_argument_far_past_64_bytes_is_einval_in_one_short_line(desk, args):
    """R-3, P-8 (a malformed query or request is exit 2 with EINVAL), docs/policy.md: a
    subject, object name or agent name of 5000 different characters (15 001 bytes) is
    refused as too long, and the refusal, like every reason that quotes a long name
    (``… (N characters)``), stays one short readable line rather than listing the whole
    argument back."""
    good = written(desk / "good.policy", f"{RULE}\n".encode())
    run = ctx("policy", *[str(good) if word == "POLICY" else word for word in args])
    no_traceback(run)
    assert (run.rc, run.out) == (2, ""), run
    assert run.err.startswith("ctx: EINVAL: ") and "bytes long" in run.err, run
    assert len(run.err.encode()) < 2000, len(run.err.encode())


# ========================================================================== explain


@dataclass
class World(OnStorage):
    """A bootstrapped root with agent ``coder`` (label ``coder_t``, uid nobody) allowed
    ``fs.read`` in both layers of P-6."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def agent_policy(self) -> Path:
        return self.storage / "agent" / "coder.d" / "policy"

    @property
    def tool_policy(self) -> Path:
        return self.storage / "tool" / "fs.read.d" / "policy"

    def verdict(self, *args: str, env: dict[str, str] | None = None) -> tuple[Run, dict]:
        run = self.ctx("policy", "explain", "coder", "tool:fs.read", "execute", "--json", *args,
                       env=env or self.env, timeout=30)  # fmt: skip
        no_traceback(run)
        facts = run.json()
        if "allowed" in facts:
            assert run.rc == (0 if facts["allowed"] else 1), run
        return run, facts


@pytest.fixture(scope="module")
def _template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("policy-grammar-template") / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    return storage


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.skip("agents run as other uids: needs root")
    top = new_scratch_dir(SCRATCH, "world-")
    made = World(top)
    copy_of_root(_template, made.storage)
    made.create_agent({"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    made.allow_tool("coder_t", "fs.read")
    try:
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("below", ["/tool", "./tool"], ids=["double-slash", "dot"])
def test_an_absolute_location_that_is_refused_is_quoted_as_given(world, below):
    """P-8 (docs/policy.md "Commands": ``--location`` is relative to the storage root or an
    absolute path within it; one that names no place is EINVAL, exit 2), "Errors you will
    see": an absolute location ``ROOT//tool`` or ``ROOT/./tool`` that is refused is named in
    the refusal as the user gave it, not by a fragment of it; nothing is read or made."""
    given = f"{world.storage}/{below}"
    before = snapshot(world.storage)
    run, error = world.verdict("--location", given)
    assert run.rc == 2 and error["error"] == "EINVAL", run
    assert repr(given) in error["message"], error
    assert repr(given) in run.err, run
    assert snapshot(world.storage) == before


@needs_root
def test_an_absolute_location_within_the_root_is_judged_as_its_relative_form(world):
    """P-8 (docs/policy.md "Commands": ``--location`` … as an absolute path within it, the
    directory of what ``ctx object which`` prints): ``ROOT/tool``, and the same path spelt
    with a doubled slash above the root, give the decision ``--location tool`` gives, word
    for word."""
    relative = world.verdict("--location", "tool")[1]
    assert relative["allowed"] is True, relative
    spelt = str(world.storage).replace("/storage", "//storage")
    for location in (f"{world.storage}/tool", f"{spelt}/tool"):
        assert world.verdict("--location", location)[1] == relative, location


@needs_root
def test_a_storage_option_that_is_a_file_or_not_there_says_so_and_the_named_repair_works(world):
    """P-8, docs/policy.md "Commands" (explain: 2 for a malformed request), R-1, R-5: a
    ``--storage`` that is a regular file is a usage error (EINVAL, exit 2, the error object
    with ``--json``); one that does not exist is ENOENT (exit 1) naming ``ctx bootstrap
    --storage DIR``; after that very repair, explain answers for that root: the agent does
    not exist there (ENOENT at step 1, exit 1)."""
    plain = written(world.top / "plain", b"not a root\n")
    run = ctx("policy", "explain", "coder", "tool:fs.read", "execute", "--storage", plain,
              "--json")  # fmt: skip
    no_traceback(run)
    assert run.rc == 2 and run.err.startswith("Usage:") and "ctx: EINVAL: " in run.err, run
    assert run.json()["error"] == "EINVAL", run
    missing = world.top / "elsewhere"
    run = ctx("policy", "explain", "coder", "tool:fs.read", "execute", "--storage", missing)
    no_traceback(run)
    repair = f"ctx bootstrap --storage {missing}"
    assert run.rc == 1 and run.err.startswith(f"ctx: ENOENT: storage root {missing} "), run
    assert repair in run.err and run.out == "", run
    assert not missing.exists()
    done = ctx(*repair.split()[1:])
    assert done.rc == 0, done
    run, facts = world.verdict("--storage", str(missing))
    assert (facts["step"], facts["errno"]) == (1, "ENOENT"), facts
    assert "there is no agent 'coder'" in facts["reason"], facts


# ============================================================== the chain reading policies


@needs_root
@pytest.mark.parametrize(
    "which,step,rel",
    [
        ("agent", 5, "agent/coder.d/policy"),
        ("tool", 6, "tool/fs.read.d/policy"),
    ],
)
def test_a_policy_the_agents_own_uid_may_not_read_denies_at_its_step_naming_it(
    world, which, step, rel
):
    """P-5 (docs/policy.md "What the chain reads": the chain reads with the rights of the
    process that asks; a refusal is a verdict on the agent when that process runs as the
    agent's uid, and a control that is unreadable denies with EACCES): the agent's policy
    (step 5) or the tool's own policy (step 6) made 0600 root's, explained as the agent's own
    uid, is a denial at that step (exit 1) naming the file and the refusal, every later step
    not reached; asked by root the same request is allowed; the file is unchanged."""
    path = world.agent_policy if which == "agent" else world.tool_policy
    content = path.read_bytes()
    path.chmod(0o600)
    nobody = world.agent_policy.parent / "identity"
    uid = json.loads(nobody.read_text())["uid"]
    done = subprocess.run(
        [*CTX_ARGV, "policy", "explain", "coder", "tool:fs.read", "execute", "--json"],
        env=world.env,
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert TRACEBACK not in done.stderr, done
    facts = json.loads(done.stdout)
    assert done.returncode == 1 and (facts["step"], facts["errno"]) == (step, "EACCES"), done
    assert facts["reason"] == (
        f"step {step} ({facts['step_name']}): {rel} cannot be read safely: Permission denied"
    ), facts
    assert [s["result"] for s in facts["steps"]] == (
        ["pass"] * (step - 1) + ["deny"] + ["not reached"] * (6 - step)
    ), facts
    assert world.verdict()[1]["allowed"] is True
    assert path.read_bytes() == content


@needs_root
def test_a_tool_control_directory_that_is_a_link_is_never_followed_to_its_policy(world):
    """P-5 step 6, P-6 (docs/policy.md "What the chain reads": every file is reached one
    component at a time without following links; a control that is a link denies with
    EACCES): ``tool/fs.read.d`` replaced by a link to a copy whose policy allows the agent is
    denied at step 6 (exit 1) naming the tool's policy, though the copy would allow; text and
    ``--json`` say the same; put back, the request is allowed again."""
    real = world.storage / "tool" / "fs.read.d"
    moved = world.storage / "tool" / "fs.read.d.real"
    real.rename(moved)
    real.symlink_to(moved.name)
    try:
        _, facts = world.verdict()
        assert (facts["step"], facts["errno"]) == (6, "EACCES"), facts
        reason = "tool/fs.read.d/policy cannot be read safely: a link or not a regular file"
        assert facts["reason"] == f"step 6 (tool/model policy): {reason}", facts
        text = world.ctx("policy", "explain", "coder", "tool:fs.read", "execute")
        assert text.rc == 1 and text.lines()[-1] == f"deny: EACCES: {facts['reason']}", text
    finally:
        real.unlink()
        moved.rename(real)
    assert world.verdict()[1]["allowed"] is True


@needs_root
def test_an_immutable_policy_is_read_as_any_other_and_nothing_writes_to_it(world):
    """P-5, P-8: the chain and the commands only read a policy: the agent's policy made
    immutable (``chattr +i``) and the tool's own policy append-only (``chattr +a``) are read
    as they are — ``check`` valid, ``query`` of both layers ``allow``, explain allowed — and
    no command fails for a file it cannot write; the files are unchanged."""
    before = (world.agent_policy.read_bytes(), world.tool_policy.read_bytes())
    with attribute(world.agent_policy, "i"), attribute(world.tool_policy, "a"):
        run = world.ctx("policy", "check", world.agent_policy, world.tool_policy)
        assert (run.rc, run.err) == (0, ""), run
        asked = queried(world.agent_policy, world.tool_policy)
        assert (asked.rc, asked.out) == (0, "allow\n"), asked
        assert world.verdict()[1]["allowed"] is True
    assert (world.agent_policy.read_bytes(), world.tool_policy.read_bytes()) == before


@needs_root
def test_a_hash_include_in_the_agents_policy_grants_nothing_at_step_5(world):
    """P-1, P-2, P-5, P-6 (docs/policy.md "Validity and decisions": a permission is granted
    when the exact rule is present): the agent's policy rewritten to hold its mount rule and a
    ``#include`` of a file granting the tool denies at step 5 saying the rule is missing —
    not that the policy is invalid — and the file it names is never read."""
    granted = written(world.top / "granted.policy", f"{RULE}\n".encode())
    world.agent_policy.write_text(f"#include {granted}\nallow coder_t mount:ctx read\n")
    _, facts = world.verdict()
    assert (facts["step"], facts["errno"]) == (5, "EACCES"), facts
    assert facts["reason"] == (
        f"step 5 (object policy): agent/coder.d/policy has no rule '{RULE}'"
    ), facts
    assert "invalid" not in facts["reason"], facts
