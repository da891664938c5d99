"""Policy files written by hand in exotic but plausible ways (SPEC §5, P-1..P-8, R-3): the
agent's ``agent/<name>.d/policy`` and a tool's own ``tool/<name>.d/policy`` saved with CRLF or
CR line ends, a UTF-8 byte order mark, tabs and runs of blanks between the words, trailing
blanks, comments (at the start of a line, indented, holding NUL, CR and bytes that are not
UTF-8), blank lines of blanks, no final newline, duplicate rules, very long lines, names at
R-3's length limits, upper-case keywords, what P-2 forbids (``deny``, globs, variables,
templates, paths), unknown classes and permissions (P-3, P-4), a rule split over two lines, an
empty file, a file that is a link, a socket, a FIFO or a directory, a file its reader may not
read, a file over the 16 MiB limit, and a policy rewritten in place while ``ctx run`` calls go
on.

For each, ``ctx policy check`` / ``query`` (P-8) and the authority chain — ``ctx policy
explain``, ``ctx run --agent`` in terminal and native mode, and the session's record of the
call — are asked.  What must hold: a valid layout grants exactly its rules; an invalid policy
grants nothing, is named by file and line with ``EINVAL`` by ``check`` (exit 1) and ``query``
(exit 2), and denies every call with ``EACCES`` at the step of its layer (5 or 6), the decision
and the session recording that step (P-5); whatever cannot be read as a policy denies."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
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
    tool_manifest,
)
from tests.support.storage import copy_of_root
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

SCRATCH = scratch_top(__file__)
AGENT, LABEL, TOOL = "ci", "ci_t", "demo.echo"
RULE = f"allow {LABEL} tool:{TOOL} execute"
MOUNT_RULE = f"allow {LABEL} mount:ctx read"
AGENT_REL = f"agent/{AGENT}.d/policy"
TOOL_REL = f"tool/{TOOL}.d/policy"
ECHO = "#!/bin/sh\ncat\n"
POLICY_LIMIT = 16 * 1024 * 1024  # docs/policy.md: a policy holds at most 16 MiB
BOM = b"\xef\xbb\xbf"


def nobody_uid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class World(OnStorage):
    """A storage root every uid may search, ``demo.echo`` installed, agent ``ci`` (label
    ``ci_t``, uid nobody) allowed it in both layers of P-6."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def agent_policy(self) -> Path:
        return self.storage / AGENT_REL

    @property
    def tool_policy(self) -> Path:
        return self.storage / TOOL_REL

    def put(self, path: Path, data: bytes) -> None:
        """``data`` saved at ``path`` as a careful administrator does: a root-owned 0644 file
        renamed over whatever was there."""
        temp = path.with_name(path.name + ".edit")
        temp.write_bytes(data)
        temp.chmod(0o644)
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        os.replace(temp, path)

    def check(self, *files: str | Path) -> tuple[Run, dict]:
        r = self.ctx("policy", "check", "--json", *files)
        return r, r.json()

    def query(self, *policies: Path, subject: str = LABEL, obj: str = f"tool:{TOOL}") -> Run:
        layers = [arg for policy in policies for arg in ("--policy", policy)]
        return self.ctx("policy", "query", *layers, subject, obj, "execute")

    def explain(self) -> dict:
        r = self.ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute", "--json")
        assert r.rc in (0, 1) and "Traceback" not in r.err, r
        verdict = r.json()
        assert verdict["allowed"] is (r.rc == 0), r
        return verdict

    def native(self, value: object, agent: str = AGENT, tool: str = TOOL) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", agent, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def terminal(self, text: str, agent: str = AGENT, tool: str = TOOL) -> Run:
        return self.ctx("run", "--agent", agent, tool, input=text)

    def outcomes(self, agent: str = AGENT) -> list[tuple[str, int | None]]:
        """Each ``tool_result`` of the agent's default session: ``("ok", None)`` or
        ``(errno, step)``."""
        path = (
            self.storage / "home" / str(nobody_uid()) / "agent" / agent / "session" / "default"
        ) / "events.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["type"] == "tool_result":
                ok = event["status"] == "ok"
                out.append(("ok", None) if ok else (event["errno"], event["step"]))
        return out


@pytest.fixture(scope="session")
def _template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bootstrapped root with ``demo.echo`` installed (its policy granting nobody yet)."""
    top = tmp_path_factory.mktemp("policy-syntax-template")
    storage = top / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    manifest = tool_manifest(top / "src", TOOL, ECHO)
    r = ctx_run("object", "install", manifest, "--tier", "system",
                env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip
    assert r.rc == 0, r
    return storage


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    w = World(top)
    try:
        nobody_uid()
        copy_of_root(_template, w.storage)
        request = {"name": AGENT, "label": LABEL, "tools": [TOOL]}
        made = w.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made
        with w.tool_policy.open("a") as f:
            f.write(RULE + "\n")
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


def assert_granted(w: World, n: int) -> None:
    """``explain`` passes every step; both modes of ``ctx run`` run the tool."""
    verdict = w.explain()
    assert [s["result"] for s in verdict["steps"]] == ["pass"] * 6, verdict
    value = {"n": n}
    r, result = w.native(value)
    assert (r.rc, result["status"], result["output"]) == (0, "ok", value), r
    term = w.terminal(f'{{"t": {n}}}')
    assert (term.rc, term.out) == (0, f'{{"t": {n}}}'), term


def assert_refused(w: World, step: int, *says: str, terminal: bool = True) -> str:
    """``explain``, ``ctx run --native`` and (unless told) terminal ``ctx run`` all deny with
    EACCES at ``step``, for one reason holding each of ``says``; the reason."""
    verdict = w.explain()
    reason = verdict["reason"]
    assert (verdict["step"], verdict["errno"]) == (step, "EACCES"), verdict
    assert reason.startswith(f"step {step} "), verdict
    for word in says:
        assert word in reason, (word, verdict)
    results = [s["result"] for s in verdict["steps"]]
    assert results == ["pass"] * (step - 1) + ["deny"] + ["not reached"] * (6 - step), verdict
    r, result = w.native({"n": 0})
    error = result["error"]
    assert r.rc == 1 and result["status"] == "error" and result["exit_status"] is None, r
    assert (error["error"], error["stage"], error["step"]) == ("EACCES", "authorize", step), r
    assert error["message"] == reason, (error, verdict)
    if terminal:
        term = w.terminal('{"t": 0}')
        assert (term.rc, term.out) == (126, ""), term
        assert term.err.startswith(f"ctx: EACCES: {reason}"), term
        assert "Traceback" not in term.err, term
    return reason


# ====================================================================== layouts that are valid


def agent_layout() -> bytes:
    return b"".join(
        [
            b"\t \n",  # a blank line of blanks
            b"# Policy of agent ci, edited by hand\n",
            b"   \t# indented: caf\xc3\xa9 \xff\xfe \x00 NUL, CR and not UTF-8\r\n",
            b"#" + b"x" * 200_000 + b"\n",  # a very long comment line
            f"allow\t{LABEL}\t\ttool:{TOOL}   execute  \t\n".encode(),
            f"  {RULE}\n".encode(),  # the same rule again, indented
            b"\n\n",
            f"{RULE}\n".encode(),  # and once more
            MOUNT_RULE.encode(),  # no final newline
        ]
    )


def tool_layout() -> bytes:
    return b"".join(
        [
            b"#\n",
            b"\t# \x1b[31m a comment holding a terminal escape\n",
            f"   allow {LABEL} tool:{TOOL} execute\t\t\n".encode(),
            b" \t \t\n",
            f"allow  {LABEL}  tool:{TOOL}  execute".encode(),
        ]
    )


def test_a_policy_laid_out_by_hand_is_read_by_its_words_alone(world):
    """P-1, P-2, P-6, P-8 (docs/policy.md "The language": blanks are spaces and tabs, comment
    lines may hold any bytes, duplicates are harmless): both layers rewritten with tabs and
    runs of blanks between the words, leading and trailing blanks, blank lines of blanks,
    indented comments holding NUL, CR, escapes and bytes that are not UTF-8, a 200 000-byte
    comment line, duplicate rules and no final newline are valid to ``check``, allow to
    ``query`` and grant the call in both modes; a subject type in another case is another
    subject (deny, exit 1)."""
    w = world
    w.put(w.agent_policy, agent_layout())
    w.put(w.tool_policy, tool_layout())
    r, report = w.check(w.agent_policy, w.tool_policy)
    assert (r.rc, r.err, report["valid"]) == (0, "", True), r
    q = w.query(w.agent_policy, w.tool_policy)
    assert (q.rc, q.out, q.err) == (0, "allow\n", ""), q
    other_case = w.query(w.agent_policy, w.tool_policy, subject="CI_T")
    assert (other_case.rc, other_case.out) == (1, "deny\n"), other_case
    assert_granted(w, 1)
    assert w.outcomes() == [("ok", None)] * 2


def test_an_empty_or_comment_only_policy_is_valid_and_allows_nothing(world):
    """P-1, P-2, P-5, P-6: an empty file, and a file of comments and blank lines only (no
    final newline), are valid (``check`` exit 0) and allow nothing: ``query`` denies (exit 1)
    and each call is refused at the step of the layer that holds it, saying the rule is
    missing, not that the file is invalid."""
    w = world
    good_agent, good_tool = w.agent_policy.read_bytes(), w.tool_policy.read_bytes()
    for content in (b"", b"# nothing yet\n\t\n   # really nothing\n \t"):
        for path, step, rel, good in (
            (w.agent_policy, 5, AGENT_REL, good_agent),
            (w.tool_policy, 6, TOOL_REL, good_tool),
        ):
            w.put(path, content)
            r, report = w.check(path)
            assert (r.rc, r.err, report["valid"]) == (0, "", True), r
            q = w.query(path)
            assert (q.rc, q.out) == (1, "deny\n"), q
            reason = assert_refused(w, step, rel, terminal=step == 5)
            assert "grants nothing" not in reason, reason
            if step == 5:  # without mount:ctx read the agent's policy is missing the mount
                assert "lacks" in reason or "has no rule" in reason, reason
            else:
                assert f"has no rule '{RULE}'" in reason, reason
            w.put(path, good)
    assert_granted(w, 2)
    each = [("EACCES", 5), ("EACCES", 5), ("EACCES", 6)]  # native + terminal, then native
    assert w.outcomes() == each * 2 + [("ok", None)] * 2


# ====================================================================== lines that are invalid


def inserted(bad: bytes) -> bytes:
    """The agent's good policy with ``bad`` as its third line: the rules it needs stay, so
    only the bad line can make the difference."""
    return f"{RULE}\n{MOUNT_RULE}\n".encode() + bad + b"\n# end\n"


GOOD_AGENT = f"{RULE}\n{MOUNT_RULE}\n".encode()
# (id, file content, [(line, words the line's problem holds)])
Variant = tuple[str, bytes, list[tuple[int, str]]]
VARIANTS: dict[str, list[Variant]] = {
    "bytes": [
        ("CRLF", GOOD_AGENT.replace(b"\n", b"\r\n"), [(1, "carriage return"), (2, "carriage")]),
        ("CR only", GOOD_AGENT.replace(b"\n", b"\r"), [(1, "carriage return")]),
        ("byte order mark", BOM + GOOD_AGENT, [(1, "byte-order mark")]),
        ("BOM before a comment", BOM + b"# c\n" + GOOD_AGENT, [(1, "byte-order mark")]),
        ("NUL", inserted(RULE.encode() + b"\x00"), [(3, "is not allowed in a rule")]),
        ("NBSP", inserted(b"allow\xc2\xa0ci_t tool:demo.echo execute"), [(3, "ASCII")]),
        ("not UTF-8", inserted(RULE.encode() + b" \xff"), [(3, "ASCII")]),
        ("form feed", inserted(RULE.encode() + b"\x0c"), [(3, "is not allowed in a rule")]),
        ("vertical tab", inserted(b"allow\x0bci_t tool:demo.echo execute"), [(3, "allowed")]),
        ("UTF-16", RULE.encode("utf-16"), [(1, "ASCII")]),
    ],
    "forbidden": [
        ("deny", inserted(b"deny ci_t tool:fs.write execute"), [(3, "there is no 'deny'")]),
        ("glob *", inserted(b"allow ci_t tool:* execute"), [(3, "globs are not supported")]),
        ("glob ?", inserted(b"allow ci_t tool:demo.ech? execute"), [(3, "globs")]),
        ("glob []", inserted(b"allow ci_t agent:rev[12] create"), [(3, "globs")]),
        ("variable", inserted(b"allow ci_t tool:$TOOL execute"), [(3, "variables")]),
        ("variable subject", inserted(b"allow ${LABEL} tool:demo.echo execute"), [(3, "var")]),
        ("template", inserted(b"allow ci_t agent:{child} create"), [(3, "templates")]),
        ("path", inserted(b"allow ci_t tool:/ctx/tool/demo.echo execute"), [(3, "paths")]),
        ("priority", inserted(RULE.encode() + b" 10"), [(3, "unexpected text after")]),
        ("trailing comment", inserted(RULE.encode() + b" # ok"), [(3, "unexpected text")]),
        ("glued comment", inserted(RULE.encode() + b"#ok"), [(3, "unknown permission")]),
    ],
    "classes": [
        ("ALLOW", inserted(b"ALLOW ci_t tool:demo.echo execute"), [(3, "unknown statement")]),
        ("TOOL", inserted(b"allow ci_t TOOL:demo.echo execute"), [(3, "unknown class 'TOOL'")]),
        ("EXECUTE", inserted(b"allow ci_t tool:demo.echo EXECUTE"), [(3, "unknown permission")]),
        ("unknown class", inserted(b"allow ci_t file:notes read"), [(3, "unknown class")]),
        ("unknown permission", inserted(b"allow ci_t tool:demo.echo run"), [(3, "unknown perm")]),
        ("another class's", inserted(b"allow ci_t tool:demo.echo read"), [(3, "permission of")]),
        ("network", inserted(b"allow ci_t network:internet connect"), [(3, "'default'")]),
        ("model without provider", inserted(b"allow ci_t model:gpt use"), [(3, "<provider>")]),
    ],
    "shape": [
        (
            "split over two lines",
            inserted(b"allow ci_t\ntool:demo.echo execute"),
            [(3, "incomplete rule"), (4, "unknown statement 'tool:demo.echo'")],
        ),
        ("three words", inserted(b"allow ci_t tool:demo.echo"), [(3, "permission is missing")]),
        ("no colon", inserted(b"allow ci_t tool demo.echo"), [(3, "is not an object")]),
        (
            "subject of 65 bytes",
            inserted(f"allow {'s' * 63}_t {RULE[11:]}".encode()),
            [(3, "65 bytes")],
        ),
        (
            "name of 65 bytes",
            inserted(f"allow ci_t tool:{'n' * 65} execute".encode()),
            [(3, "65 bytes")],
        ),
        ("name ending in .d", inserted(b"allow ci_t tool:demo.echo.d execute"), [(3, "'.d'")]),
        ("subject ending in .d", inserted(b"allow ci.d tool:demo.echo execute"), [(3, "'.d'")]),
        (
            "line of 1 MiB",
            inserted(b"allow ci_t tool:demo.echo " + b"e" * (1 << 20)),
            [(3, "unknown permission")],
        ),
    ],
}


@pytest.mark.parametrize("group", sorted(VARIANTS))
def test_an_invalid_line_in_the_agent_policy_is_named_and_grants_nothing(world, group):
    """P-1..P-5, P-8, R-3 (docs/policy.md "Validity and decisions": a policy with any invalid
    line is invalid as a whole and grants nothing): the agent's policy, holding both rules it
    needs, gets one bad line — CRLF or CR line ends, a byte order mark, NUL, NBSP, bytes not
    UTF-8, form feed, UTF-16; ``deny``, globs, variables, templates, paths, a priority, a
    comment after the rule; upper-case keywords, unknown classes and permissions; a rule split
    over two lines, names past 64 bytes, a 1 MiB line.  ``check`` names every bad line as
    ``FILE:LINE: EINVAL: …`` (exit 1, the same in ``--json``), ``query`` refuses the policy
    with EINVAL (exit 2, never ``allow``), and ``explain``, ``ctx run`` in both modes and the
    session record deny at step 5 with EACCES, naming the file and line."""
    w = world
    path = w.agent_policy
    variants = VARIANTS[group]
    for what, content, problems in variants:
        w.put(path, content)
        r, report = w.check(path)
        assert r.rc == 1 and report["valid"] is False, (what, r)
        lines = r.err.splitlines()
        assert len(lines) == len(problems), (what, r)
        for shown, found, (line, words) in zip(lines, report["files"][0]["problems"], problems,
                                               strict=True):  # fmt: skip
            assert shown.startswith(f"{path}:{line}: EINVAL: ") and words in shown, (what, r)
            assert (found["line"], found["error"]) == (line, "EINVAL"), (what, found)
            assert len(shown) < 1000, (what, "a refused line is quoted shortened")
        q = w.query(path, w.tool_policy)
        assert (q.rc, q.out) == (2, ""), (what, q)
        assert f"{path}:{problems[0][0]}: EINVAL: " in q.err, (what, q)
        first_line, first_words = problems[0]
        assert_refused(
            w,
            5,
            f"{AGENT_REL}:{first_line}: ",
            first_words,
            "an invalid policy grants nothing",
        )
        w.put(path, GOOD_AGENT)
    assert_granted(w, 3)
    outcomes = w.outcomes()
    assert outcomes == [("EACCES", 5)] * (2 * len(variants)) + [("ok", None)] * 2, outcomes


TOOL_GOOD = f"{RULE}\n".encode()
TOOL_VARIANTS = [
    ("CRLF", TOOL_GOOD.replace(b"\n", b"\r\n"), 1, "carriage return"),
    ("byte order mark", BOM + TOOL_GOOD, 1, "byte-order mark"),
    ("ALLOW", b"ALLOW ci_t tool:demo.echo execute\n" + TOOL_GOOD, 1, "unknown statement"),
    ("deny", TOOL_GOOD + b"deny other_t tool:demo.echo execute\n", 2, "there is no 'deny'"),
    ("glob subject", TOOL_GOOD + b"allow *_t tool:demo.echo execute\n", 2, "globs"),
    ("unknown class", TOOL_GOOD + b"allow ci_t program:demo.echo execute\n", 2, "unknown"),
    ("NUL", TOOL_GOOD + b"\x00\n", 2, "is not allowed in a rule"),
]


def test_an_invalid_line_in_the_tools_own_policy_denies_at_step_6(world):
    """P-5, P-6 (the tool's own policy is the second layer): the same mistakes in
    ``tool/demo.echo.d/policy``, which also holds the rule, deny every call at step 6 with
    EACCES naming ``tool/demo.echo.d/policy:LINE``, while the agent's layer still passes; the
    session records step 6 for each; the tool runs again once the file is fixed."""
    w = world
    for what, content, line, says in TOOL_VARIANTS:
        w.put(w.tool_policy, content)
        r, _ = w.check(w.tool_policy)
        assert r.rc == 1 and r.err.startswith(f"{w.tool_policy}:{line}: EINVAL: "), (what, r)
        assert says in r.err, (what, r)
        assert_refused(w, 6, f"{TOOL_REL}:{line}: ", says, "an invalid policy grants nothing")
    w.put(w.tool_policy, TOOL_GOOD)
    assert_granted(w, 4)
    assert w.outcomes() == [("EACCES", 6)] * (2 * len(TOOL_VARIANTS)) + [("ok", None)] * 2


# ====================================================================== names at their limits


def test_labels_and_names_at_the_limit_of_r3_are_granted_and_one_byte_more_is_einval(world):
    """R-3, P-1, P-7: a label of 64 bytes, a tool name of 64 bytes and a model name of two
    64-byte parts are legal in a rule: an agent with that label calls that tool when both
    layers name it (separated by tabs in one of them), and ``query`` allows them; one byte
    more in the subject, the tool name or a model part is EINVAL to ``check`` (exit 1) and to
    ``query`` (exit 2)."""
    w = world
    label, agent, tool = "L" * 62 + "_t", "a" * 64, "t" * 60 + ".ech"
    assert len(label) == len(agent) == len(tool) == 64
    manifest = tool_manifest(w.top / "src", tool, ECHO)
    assert w.ctx("object", "install", manifest, "--tier", "system").rc == 0
    made = w.ctx("agent", "create", "-",
                 input=json.dumps({"name": agent, "label": label, "tools": [tool]}))  # fmt: skip
    assert made.rc == 0, made
    rule = f"allow {label} tool:{tool} execute"
    own = w.storage / "tool" / f"{tool}.d" / "policy"
    w.put(own, own.read_bytes() + f"allow\t{label}\ttool:{tool}\texecute".encode())
    r, result = w.native({"x": 1}, agent=agent, tool=tool)
    assert (r.rc, result["status"], result["output"]) == (0, "ok", {"x": 1}), r
    agent_policy = w.storage / "agent" / f"{agent}.d" / "policy"
    model = f"model:{'p' * 64}/{'m' * 64}"
    limits = w.top / "limits.policy"
    limits.write_text(f"{rule}\nallow {label} {model} use\n")
    assert w.check(limits, agent_policy, own)[0].rc == 0
    q = w.query(agent_policy, own, subject=label, obj=f"tool:{tool}")
    assert (q.rc, q.out) == (0, "allow\n"), q
    q = w.ctx("policy", "query", "--policy", limits, label, model, "use")
    assert (q.rc, q.out) == (0, "allow\n"), q

    over = w.top / "over.policy"
    over.write_text(
        f"allow {label}x tool:{tool} execute\n"
        f"allow {label} tool:{tool}x execute\n"
        f"allow {label} model:{'p' * 65}/{'m' * 64} use\n"
        f"allow {label} model:{'p' * 64}/{'m' * 65} use\n"
    )
    r, report = w.check(over)
    assert r.rc == 1 and [p["line"] for p in report["files"][0]["problems"]] == [1, 2, 3, 4], r
    assert all("65 bytes" in line for line in r.err.splitlines()), r
    for subject, obj, perm in (
        (f"{label}x", f"tool:{tool}", "execute"),
        (label, f"tool:{tool}x", "execute"),
        (label, f"model:{'p' * 65}/{'m' * 64}", "use"),
    ):
        q = w.ctx("policy", "query", "--policy", limits, subject, obj, perm)
        assert q.rc == 2 and q.out == "" and q.err.startswith("ctx: EINVAL: "), q
        assert "65 bytes" in q.err, q


# ====================================================================== files that are no policy


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def test_a_policy_that_is_not_a_regular_file_denies_and_check_says_why(world):
    """P-5, P-8 (docs/policy.md: a control that is a link or not a regular file denies with
    EACCES; ``check`` follows a link to a regular file but refuses a FIFO, device, directory
    — and a socket — at once): the agent's policy replaced by a socket, a link to
    ``/dev/null``, a link to a valid copy, a FIFO and a directory denies at step 5 with EACCES
    naming the file, in ``explain`` and ``ctx run``, without waiting; ``check`` exits 1 with
    EINVAL and ``query`` 2 for all but the link to a valid copy."""
    w = world
    path = w.agent_policy
    copy = w.top / "copy.policy"
    copy.write_bytes(path.read_bytes())
    kinds: dict[str, Callable[[], None]] = {
        "socket": lambda: make_socket(path),
        "link to /dev/null": lambda: path.symlink_to("/dev/null"),
        "link to a valid copy": lambda: path.symlink_to(copy),
        "fifo": lambda: os.mkfifo(path),
        "directory": lambda: path.mkdir(),
    }
    for kind, make in kinds.items():
        path.unlink()
        make()
        assert_refused(w, 5, f"{AGENT_REL} cannot be read safely", terminal=kind == "fifo")
        r = w.ctx("policy", "check", path, timeout=20)
        q = w.ctx("policy", "query", "--policy", path, LABEL, f"tool:{TOOL}", "execute",
                  timeout=20)  # fmt: skip
        if kind == "link to a valid copy":
            assert (r.rc, r.err, q.rc, q.out) == (0, "", 0, "allow\n"), (r, q)
        else:
            assert r.rc == 1 and r.err.startswith(f"{path}: EINVAL: "), (kind, r)
            assert "not a regular file" in r.err, (kind, r)
            assert q.rc == 2 and "EINVAL" in q.err and q.out == "", (kind, q)
        if kind == "directory":
            path.rmdir()
            path.touch()
    w.put(path, copy.read_bytes())
    assert_granted(w, 5)


def test_a_policy_its_reader_may_not_read_is_eacces_to_check_and_query(world, unprivileged_user):
    """P-8 (docs/policy.md: ``check`` exits 1 for a file that cannot be read; ``query`` 2): a
    user who may not read a policy (0600, root's) gets EACCES naming it from ``check`` (exit
    1, ``line: null`` in ``--json``) and ``query`` (exit 2, never ``allow`` or ``deny``);
    the same file made readable is valid and allows."""
    user = unprivileged_user
    w = world
    private = w.top / "private.policy"
    private.write_bytes(w.agent_policy.read_bytes())
    private.chmod(0o600)
    env = clean_env()  # check and query read only the files they are given
    argv = CTX_ARGV
    checked = run_as(user, [*argv, "policy", "check", "--json", str(private)], env=env)
    assert checked.returncode == 1, checked
    assert checked.stderr.startswith(f"{private}: EACCES: "), checked
    [problem] = json.loads(checked.stdout)["files"][0]["problems"]
    assert (problem["line"], problem["error"]) == (None, "EACCES"), problem
    queried = run_as(user, [*argv, "policy", "query", "--policy", str(private), LABEL,
                            f"tool:{TOOL}", "execute"], env=env)  # fmt: skip
    assert queried.returncode == 2 and queried.stdout == "", queried
    assert "EACCES" in queried.stderr and str(private) in queried.stderr, queried
    private.chmod(0o644)
    queried = run_as(user, [*argv, "policy", "query", "--policy", str(private), LABEL,
                            f"tool:{TOOL}", "execute"], env=env)  # fmt: skip
    assert (queried.returncode, queried.stdout) == (0, "allow\n"), queried


def test_a_tools_own_policy_over_16_mib_is_refused_and_listed_damaged(world):
    """P-5, P-6 (docs/policy.md "What the chain reads": a policy holds at most 16 MiB; a
    larger file is refused with EFBIG naming it and its limit, the chain denies at the step
    that reads it, and ``ctx object list`` shows the tool ``damaged``, the same sentence in
    ``problems``): the tool's own policy grown sparse past the limit denies the call at step 6
    with EFBIG, and the listing marks the tool damaged."""
    w = world
    os.truncate(w.tool_policy, POLICY_LIMIT + 1)
    sentence = f"{TOOL_REL} holds more than {POLICY_LIMIT} bytes, the limit of a policy"
    verdict = w.explain()
    assert (verdict["step"], verdict["errno"]) == (6, "EFBIG"), verdict
    assert sentence in verdict["reason"], verdict
    term = w.terminal("{}")
    assert term.rc == 126 and term.err.startswith("ctx: EFBIG: step 6 "), term
    listed = w.ctx("object", "list", "--json")
    [entry] = [t for t in listed.json() if t["name"] == TOOL]
    assert entry["status"] == "damaged", entry
    assert any(str(POLICY_LIMIT) in p for p in entry["problems"]), entry


# ====================================================================== edits while calls go on


@contextlib.contextmanager
def rewriting(path: Path, versions: list[bytes]) -> Iterator[list[int]]:
    """For the length of the block, ``path`` rewritten in place over and over (truncated, then
    written in two pieces), cycling through ``versions``; yields the count of rewrites."""
    stop = threading.Event()
    done = [0]

    def loop() -> None:
        while not stop.is_set():
            data = versions[done[0] % len(versions)]
            with path.open("wb", buffering=0) as f:
                f.write(data[: len(data) // 2])
                f.write(data[len(data) // 2 :])
            done[0] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=10)


def test_a_policy_rewritten_in_place_during_calls_never_grants_while_invalid(world):
    """P-2, P-5 (an invalid policy grants nothing; the chain fails closed): while an editor
    rewrites the agent's policy in place over and over — truncated, then written in two
    pieces — with versions that each begin with an invalid line (``ALLOW``, a byte order
    mark, ``deny``, a glob) and hold the rules the call needs after it, every ``ctx run`` and
    ``explain`` made meanwhile is denied at step 5 with EACCES naming the policy (whichever
    torn or whole version it read: empty, or starting with the bad line), none is granted or
    fails otherwise, and the session records step 5 for each; the good file saved once the
    editing stops grants the very next call."""
    w = world
    body = GOOD_AGENT + b"# more\n" * 200
    versions = [
        b"ALLOW ci_t tool:demo.echo execute\n" + body,
        BOM + body,
        b"deny ci_t tool:fs.write execute\n" + body,
        b"allow ci_t tool:* execute\n" + body,
    ]
    calls = 10
    with rewriting(w.agent_policy, versions) as done:
        for n in range(calls):
            r, result = w.native({"n": n})
            assert r.rc == 1 and result["status"] == "error", (n, r)
            error = result["error"]
            assert (error["error"], error["step"]) == ("EACCES", 5), (n, r)
            assert AGENT_REL in error["message"], (n, r)
            verdict = w.explain()
            assert (verdict["step"], verdict["errno"]) == (5, "EACCES"), (n, verdict)
    assert done[0] > calls, done  # the calls did overlap the editing
    w.put(w.agent_policy, GOOD_AGENT)
    assert w.outcomes() == [("EACCES", 5)] * calls
    assert_granted(w, 6)
