"""The error branches of policy v0 and of the six-step authority chain, each reached from
outside through ``ctx policy check``, ``ctx policy query``, ``ctx policy explain`` (and, where
a refusal is also a call's, ``ctx run``), and judged by SPEC, docs/policy.md, docs/tools.md and
the help texts.

The angle: every refusal the grammar and the chain can give, provoked one at a time as a user
or an administrator provokes it — policy lines saved with CRLF ends, with a byte-order mark,
with bytes that are not ASCII or with several faults at once; model names of other shapes;
a location that names no place; objects that are links, directories, files where directories
are expected; each reason a write is read-only in the agent's view; labels that name no
subject type; controls owned by another uid or by the agent, controls that are links, FIFOs
or directories, a control directory that is a file; an agent run as the host administrator
with a read-write mount over its own controls; two mounts that share a name; a model's own
policy held to step 4's rule; and a second uid (and the agent's own uid) asking about what
it may not read.  Each is checked for the documented exit status (0 allowed, 1 denied or not
judged, 2 malformed), the errno word of the ``ctx: ERRNO: …`` line, of the ``deny: ERRNO:``
line and of the ``--json`` objects, that the reason names the file or entry at fault and the
step that denied it, and that nothing is left half-done: ``explain`` and ``query`` write
nothing, and a refused call runs nothing and logs one whole event.

SPEC ids: §5 P-1 … P-8; §1 R-3; §6 T-6, T-7; §8 A-3; §9 X-2; §12 D-1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
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
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.storage import copy_of_root

TOP = scratch_top(__file__)
NOBODY = 65534  # the uid 'ctx agent create' gives an agent by default
ASKER = 47930  # a uid of no user database, of no group of the root: another user asking
STRANGER = 47931  # a uid that owns what it should not
HOST = 47932  # a host administrator who is not root: the owner of a storage root
POLICY_LIMIT = 16 * 1024 * 1024
SHAPE = "expected 'allow SUBJECT CLASS:NAME PERMISSION'"
CR = "carriage return in a rule line; save the policy with Unix line endings"
BOM = (
    "the file starts with a UTF-8 byte-order mark (U+FEFF), which no rule line may hold, "
    "not even a comment: save it without the mark"
)
NOT_SAFE = "cannot be read safely: a link or not a regular file"
NO_VERDICT = "that refusal is uid {uid}'s own and says nothing of agent 'coder', so no verdict"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")


# -------------------------------------------------------------------------- common checks


def refused(run: Run, errno_name: str, status: int) -> None:
    """``run`` ended with ``status``, said ``ctx: ERRNO: …`` on stderr, with no traceback."""
    assert run.rc == status, run
    assert f"ctx: {errno_name}: " in run.err, run
    assert "Traceback" not in run.err, run


def refused_json(run: Run, errno_name: str, status: int) -> dict:
    """As :func:`refused` for a ``--json`` run: stdout is the error object alone, saying what
    stderr says."""
    refused(run, errno_name, status)
    error = run.json()
    assert error["error"] == errno_name and isinstance(error["errno"], int), run
    assert error["message"] in run.err, run
    return error


def as_uid(uid: int, *args, env: dict[str, str]) -> Run:
    """``ctx ARGS`` as ``uid`` (gid the same, no other group) in ``/``."""
    done = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=b"",
        capture_output=True,
        user=uid,
        group=uid,
        extra_groups=[],
        env=env,
        cwd="/",
        timeout=60,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


@dataclass
class World(OnStorage):
    """A storage root every uid may search, below this file's scratch directory, with agent
    ``coder`` (label ``coder_t``, uid nobody) made by ``ctx agent create`` and allowed
    ``fs.read`` by both layers of P-6."""

    top: Path
    storage: Path

    def control(self, name: str) -> Path:
        return self.storage / "agent" / "coder.d" / name

    def grant(self, *rules: str) -> None:
        with self.control("policy").open("a") as policy:
            policy.writelines(f"allow coder_t {rule}\n" for rule in rules)

    def mounts(self, *table: list[str]) -> None:
        self.control("mount").write_text(json.dumps([list(m) for m in table]) + "\n")

    def explain(self, *args: str, timeout: float = 30) -> Run:
        return self.ctx("policy", "explain", "coder", *args, timeout=timeout)

    def verdict(self, *args: str, timeout: float = 30) -> dict:
        """``ctx policy explain coder ARGS --json``: its decision, exit 0 when allowed and 1
        when denied, nothing on stderr but a note."""
        run = self.explain(*args, "--json", timeout=timeout)
        facts = run.json()
        assert run.rc == (0 if facts["allowed"] else 1), run
        assert "Traceback" not in run.err and "ctx: EACCES" not in run.err, run
        return facts

    def model(self, name: str = "acme/m1") -> Path:
        """``model/NAME`` and its own policy granting coder, and the agent's rule for it."""
        path = self.storage / "model" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        path.write_text("{}\n")
        path.chmod(0o644)
        own = path.with_name(path.name + ".d")
        own.mkdir(mode=0o755)
        (own / "policy").write_text(f"allow coder_t model:{name} use\n")
        (own / "policy").chmod(0o644)
        self.grant(f"model:{name} use")
        return own / "policy"

    def as_uid(self, uid: int, *args: str) -> Run:
        return as_uid(uid, *args, env=clean_env(CTX_STORAGE=str(self.storage), HOME="/"))


def denied_at(facts: dict, step: int, errno_name: str, reason: str) -> None:
    """The decision denies at ``step`` with ``errno_name`` and exactly ``reason`` (after the
    step's title), and no later step was run."""
    assert (facts["allowed"], facts["step"], facts["errno"]) == (False, step, errno_name), facts
    assert facts["reason"] == f"step {step} ({facts['step_name']}): {reason}", facts
    assert [s["result"] for s in facts["steps"][step:]] == ["not reached"] * (6 - step), facts
    assert facts["steps"][step - 1]["detail"] == reason, facts


def refused_call(world: World, step: int, reason: str) -> None:
    """``ctx run`` of fs.read as coder is refused (126) at ``step`` with ``reason``, prints
    nothing on stdout, and appends one whole event to the tool's log recording the refusal
    (its message as the records keep it: cut at 200 characters)."""
    log = world.storage / "tool" / "fs.read.d" / "log"
    logged = read_jsonl(log)
    ran = world.ctx("run", "--agent", "coder", "fs.read", '{"path": "/ctx/shared"}')
    refused(ran, "EACCES", 126)
    title = ("", "", "", "", "agent label", "object policy", "tool/model policy")[step]
    said = f"step {step} ({title}): {reason}"
    assert (ran.out, ran.err) == ("", f"ctx: EACCES: {said}\n"), ran
    [event] = read_jsonl(log)[len(logged) :]  # whole JSON: read_jsonl parses every line
    assert (event["status"], event["errno"], event["stage"], event["step"]) == (
        "error",
        "EACCES",
        "authorize",
        step,
    ), event
    kept, cut, _ = event["message"].partition("…")
    assert said.startswith(kept) and (not cut or len(kept) >= 150), (event, said)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.skip("agents run as other uids: needs root")
    top = new_scratch_dir(TOP)
    made = World(top, copy_of_root(_template, top / "storage"))
    made.create_agent({"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    made.allow_tool("coder_t", "fs.read")
    try:
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------ the language (P-1 … P-4, P-8)


def test_a_rule_line_saved_with_crlf_is_named_and_a_crlf_comment_is_not(tmp_path):
    """P-1, P-8, docs/policy.md: a rule line holds printable ASCII only, so a carriage return
    (an editor's CRLF line end) makes it invalid, and the reason says how to save the file; a
    comment line is ignored whatever it holds, and blanks are spaces and tabs only, so a line
    holding a lone CR is no blank line.  ``check`` exits 1 with one line per invalid line,
    ``query`` exits 2 with the same lines and never answers; saved with Unix line ends, the
    same rules are valid and allow."""
    text = (
        "allow coder_t tool:fs.read execute\r\n"
        "# saved on another system\r\n"
        "\r\n"
        "allow coder_t tool:fs.list execute\n"
    )
    policy = tmp_path / "crlf.policy"
    policy.write_bytes(text.encode())
    expected = [f"{policy}:1: EINVAL: {CR}", f"{policy}:3: EINVAL: {CR}"]

    checked = ctx_run("policy", "check", policy, "--json")
    assert checked.rc == 1 and checked.err.splitlines() == expected, checked
    [report] = checked.json()["files"]
    assert [(p["line"], p["error"], p["message"]) for p in report["problems"]] == [
        (1, "EINVAL", CR),
        (3, "EINVAL", CR),
    ], report

    query = ("coder_t", "tool:fs.list", "execute")
    asked = ctx_run("policy", "query", "--policy", policy, *query)
    assert (asked.rc, asked.out) == (2, ""), asked
    assert asked.err.splitlines() == expected, asked
    as_json = ctx_run("policy", "query", "--policy", policy, *query, "--json")
    assert as_json.rc == 2 and as_json.json()["error"] == "EINVAL", as_json
    assert as_json.json()["message"].startswith(f"{policy}:1: {CR}"), as_json

    policy.write_bytes(text.replace("\r\n", "\n").encode())
    assert ctx_run("policy", "check", policy).rc == 0
    allowed = ctx_run("policy", "query", "--policy", policy, *query)
    assert (allowed.rc, allowed.out) == (0, "allow\n"), allowed


def test_a_rule_line_that_is_not_ascii_is_named_and_comments_may_hold_any_bytes(tmp_path):
    """P-1, docs/policy.md: comments may be written in any language (here UTF-8, Latin-1 and
    bytes that are no text at all); a rule line is printable ASCII, so an accented subject, a
    no-break space between words or a stray byte is each reported by line, every one of them,
    and the file is invalid as a whole."""
    policy = tmp_path / "bytes.policy"
    policy.write_bytes(
        "# règles de l'agent — 注释\n".encode()
        + b"# caf\xe9 \xff\xfe\n"
        + b"allow coder_t tool:fs.read execute\n"
        + "allow cöder_t tool:fs.read execute\n".encode()
        + "allow coder_t tool:fs.read\u00a0execute\n".encode()
        + b"\xff\n"
    )
    checked = ctx_run("policy", "check", policy, "--json")
    assert checked.rc == 1, checked
    said = "EINVAL: a rule line must be ASCII text"
    assert checked.err.splitlines() == [f"{policy}:{n}: {said}" for n in (4, 5, 6)], checked
    [report] = checked.json()["files"]
    assert report["valid"] is False and [p["line"] for p in report["problems"]] == [4, 5, 6]

    comments_only = tmp_path / "comments.policy"
    comments_only.write_bytes(b"".join(policy.read_bytes().splitlines(keepends=True)[:3]))
    assert ctx_run("policy", "check", comments_only).rc == 0
    asked = ctx_run(
        "policy", "query", "--policy", comments_only, "coder_t", "tool:fs.read", "execute"
    )
    assert (asked.rc, asked.out) == (0, "allow\n"), asked


MODEL_SHAPES = {
    "one part": ("model:openai", "model:openai: a model name is <provider>/<model>"),
    "three parts": ("model:openai/gpt/5", "model:openai/gpt/5: a model name is <provider>/<model>"),
    "a part ending in .d": (
        "model:openai/gpt.d",
        "model:openai/gpt.d: 'gpt.d' ends in '.d', which is reserved for control directories",
    ),
    "an empty model": ("model:openai/", "model:openai/: a name must not be empty"),
    "a glob": ("model:openai/*", "model:openai/*: globs are not supported (P-2); name each object"),
}


@needs_root
def test_a_model_name_of_another_shape_is_einval_in_check_query_and_explain(world):
    """R-3, P-3, P-7: a model is ``<provider>/<model>``, each part an object name; anything
    else (one part, three, a part ending in ``.d``, an empty part, a glob) is EINVAL naming
    the object and the rule it breaks — ``check`` exits 1 with ``FILE:LINE: EINVAL: …``,
    ``query`` and ``explain`` exit 2 (a malformed query) with the same reason, print no
    verdict and judge nothing."""
    good = world.top / "good.policy"
    good.write_text("allow coder_t model:openai/gpt use\n")
    policy = world.top / "model.policy"
    before = snapshot(world.storage)
    for obj, reason in MODEL_SHAPES.values():
        policy.write_text(f"allow coder_t {obj} use\n")
        checked = ctx_run("policy", "check", policy)
        assert (checked.rc, checked.err) == (1, f"{policy}:1: EINVAL: {reason}\n"), checked

        asked = ctx_run("policy", "query", "--policy", good, "coder_t", obj, "use", "--json")
        assert refused_json(asked, "EINVAL", 2)["message"] == reason

        explained = world.explain(obj, "use")
        refused(explained, "EINVAL", 2)
        assert (explained.out, explained.err) == ("", f"ctx: EINVAL: {reason}\n"), explained
    assert snapshot(world.storage) == before


def test_a_policy_file_that_does_not_exist_is_enoent_to_check_and_query(tmp_path):
    """P-8, docs/policy.md (check: exit 1 for a file that cannot be read, with ``line: null``
    in ``--json``; query: exit 2, never ``allow`` nor ``deny``): a FILE that is not there is
    ENOENT naming it, the other files are still judged, and nothing is made at its path."""
    good = tmp_path / "good.policy"
    good.write_text("allow coder_t tool:fs.read execute\n")
    missing = tmp_path / "missing.policy"
    said = f"cannot read {missing}: No such file or directory"

    checked = ctx_run("policy", "check", good, missing, "--json")
    assert checked.rc == 1 and checked.err == f"{missing}: ENOENT: {said}\n", checked
    reports = {report["file"]: report for report in checked.json()["files"]}
    assert reports[str(good)] == {"file": str(good), "valid": True, "problems": []}, reports
    [problem] = reports[str(missing)]["problems"]
    assert (problem["line"], problem["error"], problem["message"]) == (None, "ENOENT", said)

    query = ("coder_t", "tool:fs.read", "execute")
    asked = ctx_run("policy", "query", "--policy", good, "--policy", missing, *query)
    refused(asked, "ENOENT", 2)
    assert (asked.out, asked.err) == ("", f"ctx: ENOENT: {said}\n"), asked
    as_json = ctx_run("policy", "query", "--policy", good, "--policy", missing, *query, "--json")
    assert refused_json(as_json, "ENOENT", 2)["message"] == said
    assert not missing.exists() and sorted(os.listdir(tmp_path)) == ["good.policy"]


@needs_root
def test_a_byte_order_mark_is_named_by_check_query_explain_and_a_refused_call(world):
    """P-1, P-5, T-7, docs/policy.md: an editor's UTF-8 byte-order mark is named on line 1,
    even before a comment, not called 'not ASCII'; in the agent's own policy it makes the
    policy invalid, which grants nothing: explain denies at step 5 with EACCES quoting the
    reason, and ``ctx run`` is refused (126) with the same sentence, running nothing and
    logging one whole event that records the step."""
    policy = world.control("policy")
    policy.write_bytes(b"\xef\xbb\xbf" + policy.read_bytes())
    checked = ctx_run("policy", "check", policy, "--json")
    assert (checked.rc, checked.err) == (1, f"{policy}:1: EINVAL: {BOM}\n"), checked
    asked = ctx_run("policy", "query", "--policy", policy, "coder_t", "tool:fs.read", "execute")
    assert (asked.rc, asked.out, asked.err) == (2, "", f"{policy}:1: EINVAL: {BOM}\n"), asked

    before = snapshot(world.storage)
    reason = f"agent/coder.d/policy:1: {BOM}; an invalid policy grants nothing"
    denied_at(world.verdict("tool:fs.read", "execute"), 5, "EACCES", reason)
    assert snapshot(world.storage) == before

    refused_call(world, 5, reason)


@needs_root
def test_several_bad_lines_in_an_agent_policy_are_counted_in_explain_and_query(world):
    """P-8, docs/policy.md: a policy with any invalid line is invalid as a whole and grants
    nothing; the checker reports every invalid line, and where one sentence is given (the
    chain's reason, ``query``'s error object) it names the first and counts the others."""
    world.grant("tool:fs.read read", "shared:proj delete")
    with world.control("policy").open("a") as rules:
        rules.write("deny coder_t tool:fs.read execute\n")
    first = (
        "agent/coder.d/policy:5: 'read' is a permission of shared, session, mount, agent, not "
        "of tool; tool has execute"
    )
    facts = world.verdict("tool:fs.read", "execute")
    reason = f"{first} (and 2 more invalid lines); an invalid policy grants nothing"
    denied_at(facts, 5, "EACCES", reason)

    policy = world.control("policy")
    asked = ctx_run("policy", "query", "--policy", policy, "coder_t", "tool:fs.read", "execute",
                    "--json")  # fmt: skip
    assert (asked.rc, "Traceback" in asked.err) == (2, False), asked
    error = asked.json()
    assert (error["error"], error["errno"]) == ("EINVAL", 22), error
    assert error["message"].startswith(f"{policy}:5: 'read' is a permission of shared"), error
    assert "(and 2 more invalid lines)" in error["message"], error
    assert [line.split(": EINVAL: ")[0] for line in asked.err.splitlines()] == [
        f"{policy}:{n}" for n in (5, 6, 7)
    ], asked
    assert "unknown permission 'delete'; shared has read, write" in asked.err, asked
    assert "there is no 'deny' (P-2)" in asked.err, asked


# ------------------------------------------------------------------ malformed requests (P-8)

BAD_LOCATIONS = [
    ("session:s1", "read", "home/abc/agent/coder/session", "session"),
    ("session:s1", "write", "shared/.x/agent/coder/session", "session"),
    ("session:s1", "read", "home/65534/agent/coder", "session"),
    ("session:s1", "resume", "home/65534/agent/x.d/session", "session"),
    ("tool:fs.read", "execute", "shared/.x/tool", "tool"),
    ("tool:fs.read", "execute", "home/65534/tools", "tool"),
]


@needs_root
def test_a_location_that_is_no_place_of_its_class_is_einval(world):
    """P-8, docs/policy.md: ``--location`` names where a tool (``tool``, ``home/<uid>/tool``,
    ``shared/<space>/tool``) or a session (``home/<uid>/agent/<agent>/session``,
    ``shared/<space>/agent/<agent>/session``) lives, each name legal (R-3); anything else is
    a malformed request: EINVAL, exit 2, quoting the location, no verdict, nothing read or
    made."""
    before = snapshot(world.storage)
    for obj, perm, location, kind in BAD_LOCATIONS:
        said = f"'{location}' is not a place where a {kind} lives"
        text = world.explain(obj, perm, "--location", location)
        refused(text, "EINVAL", 2)
        assert (text.out, text.err) == ("", f"ctx: EINVAL: {said}\n"), text
        as_json = world.explain(obj, perm, "--location", location, "--json")
        assert refused_json(as_json, "EINVAL", 2)["message"] == said
    assert snapshot(world.storage) == before


# ---------------------------------------------------------------------- step 2: mode bits


@needs_root
def test_step_2_names_a_tool_that_is_a_link_or_a_directory(world):
    """P-5 step 2, docs/policy.md: an object is reached through no symbolic link and must be
    what its class needs (a tool a regular file); a tool ``tool/alias`` that is a link to
    ``fs.read``, and one that is a directory, are each refused at step 2 with EACCES naming
    it, though both policies would allow them; text and ``--json`` say the same."""
    tools = world.storage / "tool"
    (tools / "alias").symlink_to("fs.read")
    (tools / "box").mkdir(mode=0o755)
    for name in ("alias", "box"):
        (tools / f"{name}.d").mkdir(mode=0o755)
        (tools / f"{name}.d" / "policy").write_text(f"allow coder_t tool:{name} execute\n")
        world.grant(f"tool:{name} execute")
    before = snapshot(world.storage)
    for name, why in (
        ("alias", "tool/alias is a symbolic link; links are never followed"),
        ("box", "tool/box is not a regular file"),
    ):
        denied_at(world.verdict(f"tool:{name}", "execute"), 2, "EACCES", why)
        text = world.explain(f"tool:{name}", "execute")
        assert text.rc == 1 and text.lines()[-1] == f"deny: EACCES: step 2 (mode bits): {why}"
    assert snapshot(world.storage) == before


@needs_root
def test_step_2_tells_a_space_that_is_a_file_from_a_model_below_a_file(world):
    """P-4, P-5 step 2, docs/policy.md (a space is a directory; a model any entry): a space
    ``shared/notes`` that is a regular file is refused with EACCES ("is not a directory"),
    and a model ``acme/m1`` whose provider ``model/acme`` is a file does not exist (ENOENT),
    naming the entry where the path ends."""
    (world.storage / "shared" / "notes").write_text("not a space\n")
    (world.storage / "model" / "acme").write_text("not a provider\n")
    world.grant("shared:notes read", "model:acme/m1 use")
    denied_at(world.verdict("shared:notes", "read"), 2, "EACCES", "shared/notes is not a directory")
    denied_at(world.verdict("model:acme/m1", "use"), 2, "ENOENT", "model/acme is not a directory")


@needs_root
def test_step_2_for_a_mount_judges_its_source_by_itself(world):
    """P-5 step 2, docs/policy.md: ``mount:N`` needs r (or w) on the mount's host source,
    judged by itself: a source the agent may not enter is EACCES with its mode and owner, a
    source that is gone is ENOENT naming it; both are listed as usable mounts by ``agent
    show``, which reads the table alone."""
    secret = world.top / "secret"
    secret.mkdir(mode=0o700)
    gone = world.top / "gone"
    world.mounts(
        [str(gone), "/data", "ro"],
        [str(secret), "/secret", "rw"],
        [str(world.storage), "/ctx", "ro"],
    )
    world.grant("mount:data read", "mount:secret read", "mount:secret write")
    denied_at(
        world.verdict("mount:secret", "write"),
        2,
        "EACCES",
        f"{secret} needs -wx but mode 0700, owner 0:0 grants --- to uid {NOBODY}",
    )
    facts = world.verdict("mount:data", "read")
    assert (facts["step"], facts["errno"]) == (2, "ENOENT"), facts
    assert facts["reason"].endswith(f"{gone} is missing"), facts
    shown = world.ctx("agent", "show", "coder", "--json").json()
    assert [m[1] for m in shown["mounts"]] == ["/data", "/secret", "/ctx"], shown
    assert shown["withheld_mounts"] == [] and shown["problems"] == [], shown


@needs_root
def test_the_agents_own_explanation_names_the_directory_it_may_not_search(world):
    """P-5 step 2, docs/policy.md ("a refusal is a verdict on the agent when that process is
    root or runs as the agent's uid"; "EACCES: step 2 (mode bits): search (x) on tool is
    denied to uid 1001 — a directory on the way is closed to the agent"): a provider
    directory ``model/acme`` closed to the agent (0700, root's) denies ``model:acme/m1 use``
    at step 2; asked as root and as the agent's own uid, the verdict and the directory it
    names are the same."""
    world.model()
    (world.storage / "model" / "acme").chmod(0o700)
    why = f"search (x) on model/acme is denied to uid {NOBODY}"
    denied_at(world.verdict("model:acme/m1", "use"), 2, "EACCES", why)

    run = world.as_uid(NOBODY, "policy", "explain", "coder", "model:acme/m1", "use", "--json")
    assert run.rc == 1 and "Traceback" not in run.err, run
    facts = run.json()
    assert (facts["step"], facts["errno"]) == (2, "EACCES"), facts
    assert "model/acme" in facts["reason"], facts


# ---------------------------------------------------------------- step 3: mount visibility


def _other_agents_entry(world: World) -> tuple[tuple[str, ...], str]:
    entry = world.storage / "agent" / "other"
    entry.write_text("#!/bin/sh\nexit 0\n")
    entry.chmod(0o777)
    world.grant("agent:other write")
    why = "in its view of the storage root only its home and spaces are ever writable"
    return ("agent:other", "write"), f"agent/other is visible to the agent only read-only: {why}"


def _another_uids_home(world: World) -> tuple[tuple[str, ...], str]:
    session = world.storage / "home" / "1234" / "agent" / "coder" / "session" / "s1"
    session.mkdir(parents=True)
    for path in (session, *list(session.parents)[:4]):
        path.chmod(0o755)
    for path in (session, *list(session.parents)[:3]):
        os.chown(path, NOBODY, NOBODY)
    world.grant("session:s1 write")
    location = "home/1234/agent/coder/session"
    why = f"of the homes, its view of the storage root shows only its own (home/{NOBODY})"
    return (
        ("session:s1", "write", "--location", location),
        f"{location}/s1 is not in the view of agent 'coder': {why}",
    )


def _the_manual_bundle(world: World) -> tuple[tuple[str, ...], str]:
    (world.storage / "shared" / "cortexfs-docs").chmod(0o777)
    world.grant("shared:cortexfs-docs write")
    why = "the manual bundle is read-only (D-1)"
    return (
        ("shared:cortexfs-docs", "write"),
        f"shared/cortexfs-docs is visible to the agent only read-only: {why}",
    )


def _a_space_written_unread(world: World) -> tuple[tuple[str, ...], str]:
    (world.storage / "shared" / "sp").mkdir(mode=0o777)
    (world.storage / "shared" / "sp").chmod(0o777)
    world.grant("shared:sp write")
    why = (
        "a space is writable in its view only when its policy allows both 'shared:sp read' "
        "and 'shared:sp write'"
    )
    return ("shared:sp", "write"), f"shared/sp is visible to the agent only read-only: {why}"


READ_ONLY_VIEWS: dict[str, Callable[[World], tuple[tuple[str, ...], str]]] = {
    "another agent's entry": _other_agents_entry,
    "another uid's home": _another_uids_home,
    "the manual bundle": _the_manual_bundle,
    "a space written but not read": _a_space_written_unread,
}


@needs_root
@pytest.mark.parametrize("case", sorted(READ_ONLY_VIEWS))
def test_step_3_says_why_a_write_the_mode_bits_allow_is_read_only_in_the_view(world, case):
    """P-5 step 3, docs/policy.md (*Mounts*: through ``/ctx`` only the agent's own home and
    the spaces its policy lets it read and write are writable; the manual bundle is
    read-only, X-2, D-1): a write the mode bits allow (the entry is writable by every uid)
    but the agent's view does not is denied at step 3 with EACCES, and the reason says which
    rule of the view refuses it; explain writes nothing."""
    args, reason = READ_ONLY_VIEWS[case](world)
    before = snapshot(world.storage)
    facts = world.verdict(*args)
    denied_at(facts, 3, "EACCES", reason)
    assert facts["steps"][1]["result"] == "pass", facts
    assert snapshot(world.storage) == before
    if case == "a space written but not read":
        world.grant("shared:sp read")  # what the reason asks for
        assert world.verdict(*args)["allowed"] is True


@needs_root
def test_step_5_names_the_write_rule_a_read_write_mount_lacks(world):
    """P-5 step 5, docs/policy.md: the policy must grant a mount the object is seen through,
    ``mount:<name> write`` as well to write through a mount other than the storage root's; a
    space seen writably only through its ``rw`` mount ``/sp``, whose policy has ``mount:sp
    read`` alone, is denied at step 5 naming the rule it lacks; with that rule it is
    allowed through that mount."""
    space = world.storage / "shared" / "sp"
    space.mkdir(mode=0o777)
    space.chmod(0o777)
    world.mounts([str(space), "/sp", "rw"], [str(world.storage), "/ctx", "ro"])
    world.grant("shared:sp write", "mount:sp read")
    denied_at(
        world.verdict("shared:sp", "write"),
        5,
        "EACCES",
        "shared/sp is seen writably only through mount sp, which agent/coder.d/policy does not "
        "grant: it lacks 'allow coder_t mount:sp write'",
    )
    world.grant("mount:sp write")
    facts = world.verdict("shared:sp", "write")
    assert facts["allowed"] is True, facts
    assert facts["steps"][2]["detail"] == f"shared/sp appears at /sp through {space} -> /sp (rw)"
    assert facts["steps"][4]["detail"].endswith("its mount 'sp' is granted"), facts


def _same_target_rw_then_ro(world: World, space: Path) -> tuple[str, str]:
    world.mounts(
        [str(space), "/sp", "rw"], [str(space), "/sp", "ro"], [str(world.storage), "/ctx", "ro"]
    )
    world.grant("shared:sp write", "mount:sp read", "mount:sp write")
    return "write", "has no 'mount:sp write'"


def _two_targets_of_one_name(world: World, space: Path) -> tuple[str, str]:
    world.mounts([str(space), "/a/sp", "ro"], [str(space), "/b/sp", "ro"])
    world.grant("shared:sp read", "mount:sp read")
    return "read", "does not grant"


SHARED_NAMES = {
    "one target, rw then ro": _same_target_rw_then_ro,
    "two targets ending in sp": _two_targets_of_one_name,
}


@needs_root
@pytest.mark.parametrize("case", sorted(SHARED_NAMES))
def test_a_reason_never_blames_the_policy_for_a_mount_rule_it_holds(world, case):
    """P-5, docs/tools.md (a mount is named by the last component of its target, so two may
    not share it: both are withheld, "given to no tool", and ``ctx agent show`` lists them
    with the reason), docs/policy.md (the decision records which step denied and why): a
    space seen only through two mounts named ``sp`` is denied, and the reason names the
    shared name once — never a rule of the agent's policy that the policy holds."""
    space = world.storage / "shared" / "sp"
    space.mkdir(mode=0o777)
    space.chmod(0o777)
    perm, blame = SHARED_NAMES[case](world, space)
    shown = world.ctx("agent", "show", "coder", "--json").json()
    assert len(shown["withheld_mounts"]) == 2, shown
    assert all("2 mounts are named 'sp'" in m["reason"] for m in shown["withheld_mounts"])

    facts = world.verdict("shared:sp", perm)
    assert (facts["allowed"], facts["errno"]) == (False, "EACCES"), facts
    assert facts["reason"].count("2 mounts are named 'sp'") <= 1, facts
    assert blame not in facts["reason"], facts


@needs_root
def test_a_mount_request_for_a_name_two_mounts_share_is_refused_as_withheld(world):
    """P-5 step 2, docs/tools.md (*Agents, host side*: a withheld mount "is given to no tool
    and bound in no sandbox, and the chain refuses ``mount:<name>`` at step 2 (EACCES, 'its
    mount … is withheld' and why, as ``ctx agent show`` says it)"; ``agent show`` lists as
    withheld "two targets ending in the same name")."""
    one, two = world.top / "d1", world.top / "d2"
    for source in (one, two):
        source.mkdir(mode=0o755)
    world.mounts([str(one), "/a/data", "ro"], [str(two), "/b/data", "ro"],
                 [str(world.storage), "/ctx", "ro"])  # fmt: skip
    world.grant("mount:data read")
    shown = world.ctx("agent", "show", "coder", "--json").json()
    [why] = {m["reason"] for m in shown["withheld_mounts"]}
    assert why.startswith("2 mounts are named 'data'"), shown
    facts = world.verdict("mount:data", "read")
    assert (facts["step"], facts["errno"]) == (2, "EACCES"), facts
    assert facts["reason"] == f"step 2 (mode bits): its mount 'data' is withheld: {why}", facts


# ------------------------------------------------------------------- step 4: agent label

LABELS = {
    "missing": (
        None,
        "agent 'coder' has no label, so it has no subject type (agent/coder.d/label is missing)",
    ),
    "not ASCII": (
        "cod\u00e9r_t\n".encode(),
        "agent/coder.d/label is invalid: it is not ASCII",
    ),
    "empty": (
        b"",
        "agent/coder.d/label is invalid: illegal subject type: a name must not be empty",
    ),
    "two words": (
        b"coder_t admin_t\n",
        "agent/coder.d/label is invalid: illegal subject type: 'coder_t admin_t' holds ' ', "
        "which an object name may not hold (allowed: A-Z a-z 0-9 . _ -)",
    ),
    "a control directory's name": (
        b"coder.d\n",
        "agent/coder.d/label is invalid: illegal subject type: 'coder.d' ends in '.d', which "
        "is reserved for control directories",
    ),
    "a glob": (
        b"coder_*\n",
        "agent/coder.d/label is invalid: subject 'coder_*': globs are not supported (P-2); "
        "name each object",
    ),
}


@needs_root
def test_a_label_that_names_no_subject_type_denies_at_step_4_and_a_call_logs_it(world):
    """P-5 step 4 (the agent has a valid subject type), A-3, T-7, docs/tools.md (``agent
    show`` lists an unusable label as a problem): a label that is missing, not ASCII, empty,
    two words, a control directory's name or a glob is refused at step 4 with EACCES naming
    the file and the fault; ``agent show`` reports it the same way; ``ctx run`` is refused
    (126) with the same sentence, runs nothing and logs one whole event recording step 4;
    the label written back, the call is allowed again."""
    label = world.control("label")
    for content, said in LABELS.values():
        if content is None:
            label.unlink()
        else:
            label.write_bytes(content)
        denied_at(world.verdict("tool:fs.read", "execute"), 4, "EACCES", said)
        shown = world.ctx("agent", "show", "coder", "--json")
        assert shown.rc == 0, shown
        assert (shown.json()["label"], shown.json()["problems"]) == (None, [said]), shown
        refused_call(world, 4, said)
        label.write_text("coder_t\n")
        label.chmod(0o644)
        assert world.verdict("tool:fs.read", "execute")["allowed"] is True


OWNERS = {
    "a label of another uid": ("agent/coder.d/label", STRANGER, "agent/coder.d/label"),
    "a control directory of another uid": ("agent/coder.d", STRANGER, "agent/coder.d/identity"),
    "a policy of the agent's uid": ("agent/coder.d/policy", NOBODY, "agent/coder.d/policy"),
    "the agents' directory of the agent's uid": ("agent", NOBODY, "agent/coder.d/identity"),
}


@needs_root
def test_a_control_of_another_uid_or_of_the_agents_own_denies_at_step_4(world):
    """P-5 step 4, docs/policy.md (*Host-owned controls*: a control, or ``agent/<name>.d``,
    ``agent`` above it, that belongs to the agent's own uid or to any uid but root and the
    host administrator is refused, naming the control and the entry at fault and whom to give
    it to): each owner is named, the agent's own uid as such; given back to root, the call
    is allowed again."""
    for entry, owner, control in OWNERS.values():
        path = world.storage / entry
        os.lchown(path, owner, -1)
        at_fault = f"{control} is not host-owned: {entry} belongs to uid {owner}"
        if owner == NOBODY:
            why = f"{at_fault}, the agent's own, so the agent could rewrite it"
        else:
            why = f"{at_fault}, who could rewrite it for agent 'coder'"
        denied_at(
            world.verdict("tool:fs.read", "execute"),
            4,
            "EACCES",
            f"{why} (give it to the host administrator, uid 0)",
        )
        os.lchown(path, 0, -1)
        assert world.verdict("tool:fs.read", "execute")["allowed"] is True


def _host_run(world: World, *table: list[str]) -> None:
    """The storage root made the host administrator's (uid HOST), agent coder run as that
    uid, with ``table`` as its mounts."""
    os.chown(world.storage, HOST, HOST)
    world.control("identity").write_text(json.dumps({"uid": HOST, "gid": HOST, "groups": []}))
    world.mounts(*table)


@needs_root
def test_an_agent_of_the_host_administrator_is_refused_controls_a_read_write_mount_reaches(world):
    """P-5 steps 4 and 6, docs/policy.md (*Host-owned controls*: a control, or a tool's own
    policy, is refused when "the file, or a directory above it, is writable by the agent's
    uid … and the agent sees it through a read-write mount"; for an agent run as the host
    administrator only a read-write mount counts): with the root read-only at ``/ctx`` the
    call is allowed; a read-write mount of the root, of ``agent/`` or of ``tool/`` (each
    the host's) is refused at step 4 or 6, naming the entry, the uid and the mount."""
    root = world.storage
    ctx_ro = [str(root), "/ctx", "ro"]
    _host_run(world, ctx_ro)
    assert world.verdict("tool:fs.read", "execute")["allowed"] is True

    world.mounts([str(root), "/ctx", "rw"])
    denied_at(
        world.verdict("tool:fs.read", "execute"),
        4,
        "EACCES",
        f"agent/coder.d/identity is not host-owned: the agent may change {root} "
        f"(as uid {HOST}, at /ctx through {root} -> /ctx (rw))",
    )

    os.chown(root / "agent", HOST, HOST)
    world.mounts(ctx_ro, [str(root / "agent"), "/agents", "rw"])
    denied_at(
        world.verdict("tool:fs.read", "execute"),
        4,
        "EACCES",
        f"agent/coder.d/identity is not host-owned: the agent may change agent "
        f"(as uid {HOST}, at /agents through {root}/agent -> /agents (rw))",
    )

    os.chown(root / "agent", 0, 0)
    os.chown(root / "tool", HOST, HOST)
    world.mounts(ctx_ro, [str(root / "tool"), "/tools", "rw"])
    denied_at(
        world.verdict("tool:fs.read", "execute"),
        6,
        "EACCES",
        f"tool/fs.read.d/policy is not host-owned: the agent may change tool "
        f"(as uid {HOST}, at /tools through {root}/tool -> /tools (rw))",
    )
    world.mounts(ctx_ro, [str(root / "tool"), "/tools", "ro"])
    assert world.verdict("tool:fs.read", "execute")["allowed"] is True


# ------------------------------------------------------ steps 5 and 6: the two policies


@needs_root
def test_the_manual_bundle_is_every_agents_to_read_and_has_no_own_policy(world):
    """X-2, D-1 (manuals grant nothing), docs/tools.md (the bundle's files are such "that
    every agent can read them and none can change them"): with a policy that grants nothing
    at all, reading ``shared:cortexfs-docs`` passes step 5 as the manual bundle and step 6
    is n/a (a space has no own policy), while the same policy allows no tool."""
    world.control("policy").write_text("# nothing granted\n")
    facts = world.verdict("shared:cortexfs-docs", "read")
    assert facts["allowed"] is True and facts["errno"] is None, facts
    assert [s["result"] for s in facts["steps"]] == ["pass"] * 5 + ["n/a"], facts
    assert (
        facts["steps"][4]["detail"] == "cortexfs-docs is the manual bundle, every agent's to read"
    )
    assert facts["steps"][5]["detail"] == "shared objects have no own policy", facts
    denied_at(
        world.verdict("tool:fs.read", "execute"),
        5,
        "EACCES",
        "agent/coder.d/policy has no rule 'allow coder_t tool:fs.read execute'",
    )


HOOKS = Path("tool/fs.read.d/hooks")


def _cap_of_another_uid(world: World) -> tuple[str, Callable[[], None]]:
    cap = world.storage / "tool" / "fs.read.d" / "cap"
    os.chown(cap, STRANGER, -1)
    why = (
        f"tool/fs.read.d/cap is not host-owned: tool/fs.read.d/cap belongs to uid {STRANGER}, "
        "who could rewrite it for agent 'coder' (give it to the host administrator, uid 0)"
    )
    return why, lambda: os.chown(cap, 0, -1)


def _description_writable(world: World) -> tuple[str, Callable[[], None]]:
    description = world.storage / "tool" / "fs.read.d" / "description"
    description.chmod(0o666)
    why = (
        "tool/fs.read.d/description is not host-owned: tool/fs.read.d/description is writable "
        "by its group or by others (mode 0666); the agent's controls, the tools it runs and "
        "their directories must be writable by their owner alone (chmod go-w)"
    )
    return why, lambda: description.chmod(0o644)


def _post_hook_of_another_uid(world: World) -> tuple[str, Callable[[], None]]:
    post = world.storage / HOOKS / "post.d" / "10-note"
    post.write_text(f"#!/bin/sh\ntouch {world.top}/post-hook-ran\n")
    post.chmod(0o755)
    os.chown(post, STRANGER, STRANGER)
    why = (
        f"{HOOKS}/post.d/10-note is not host-owned: {HOOKS}/post.d/10-note belongs to uid "
        f"{STRANGER}, who could rewrite it for agent 'coder' (give it to the host "
        "administrator, uid 0)"
    )
    return why, post.unlink


def _pre_hooks_writable(world: World) -> tuple[str, Callable[[], None]]:
    pre = world.storage / HOOKS / "pre.d"
    pre.chmod(0o775)
    why = (
        f"{HOOKS}/pre.d is not host-owned: {HOOKS}/pre.d is writable by its group or by others "
        "(mode 0775); the agent's controls, the tools it runs and their directories must be "
        "writable by their owner alone (chmod go-w)"
    )
    return why, lambda: pre.chmod(0o755)


TOOL_PARTS = (
    _cap_of_another_uid,
    _description_writable,
    _post_hook_of_another_uid,
    _pre_hooks_writable,
)


@needs_root
def test_a_tool_control_or_hook_others_could_change_denies_at_step_6(world):
    """P-5 step 6, P-6, T-6, docs/policy.md (a tool's other controls, ``hooks/pre.d/``,
    ``hooks/post.d/`` and each hook in them are host-owned by step 4's rule; only the agent's
    own uid may own a post-hook): a control or hook another uid owns, or one writable by
    group or others, is refused at step 6 naming it and the fix; ``ctx run`` is refused (126)
    with the same reason, runs neither the tool nor the hook, and logs one whole event; put
    right, the call is allowed again."""
    for spoil in TOOL_PARTS:
        why, mend = spoil(world)
        denied_at(world.verdict("tool:fs.read", "execute"), 6, "EACCES", why)
        refused_call(world, 6, why)
        assert not (world.top / "post-hook-ran").exists()
        mend()
        assert world.verdict("tool:fs.read", "execute")["allowed"] is True


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o644)


def _link(path: Path) -> None:
    kept = path.with_name("kept-policy")
    path.rename(kept)
    path.symlink_to(kept.name)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir(mode=0o755)


def _sparse(path: Path) -> None:
    with path.open("r+b") as policy:
        policy.truncate(POLICY_LIMIT + 1)


MODEL_POLICIES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "writable by others": (
        lambda p: p.chmod(0o666),
        "EACCES",
        "model/acme/m1.d/policy is not host-owned: model/acme/m1.d/policy is writable by its "
        "group or by others (mode 0666); the agent's controls, the tools it runs and their "
        "directories must be writable by their owner alone (chmod go-w)",
    ),
    "a provider of the agent's uid": (
        lambda p: os.chown(p.parents[1], NOBODY, -1),
        "EACCES",
        f"model/acme/m1.d/policy is not host-owned: model/acme belongs to uid {NOBODY}, the "
        "agent's own, so the agent could rewrite it (give it to the host administrator, uid 0)",
    ),
    "a FIFO": (_fifo, "EACCES", f"model/acme/m1.d/policy {NOT_SAFE}"),
    "a symbolic link": (_link, "EACCES", f"model/acme/m1.d/policy {NOT_SAFE}"),
    "a directory": (_directory, "EACCES", f"model/acme/m1.d/policy {NOT_SAFE}"),
    "over 16 MiB": (
        _sparse,
        "EFBIG",
        "model/acme/m1.d/policy holds more than 16777216 bytes, the limit of a policy, so it "
        "is not read; rewrite it",
    ),
}


@needs_root
@pytest.mark.parametrize("case", sorted(MODEL_POLICIES))
def test_a_models_own_policy_is_held_to_step_4s_rule_and_read_safely(world, case):
    """P-5 step 6, P-6, docs/policy.md (*What the chain reads*: ``model/<provider>/<model>.d/
    policy`` is read without following a link, never waiting on a FIFO, no further than a
    byte past 16 MiB; a larger one is EFBIG naming it and its limit; the policy is host-owned
    by step 4's rule): each fault denies ``model:acme/m1 use`` at step 6, promptly, with the
    documented errno and the file named; explain writes nothing."""
    change, errno_name, reason = MODEL_POLICIES[case]
    policy = world.model()
    assert world.verdict("model:acme/m1", "use")["allowed"] is True
    change(policy)
    before = snapshot(world.storage) if case != "a FIFO" else None
    started = time.monotonic()
    denied_at(world.verdict("model:acme/m1", "use", timeout=20), 6, errno_name, reason)
    assert time.monotonic() - started < 10
    if before is not None:
        assert snapshot(world.storage) == before


# ------------------------------------------------------- the agent's controls, read safely


def _identity_link(world: World) -> None:
    identity = world.control("identity")
    kept = world.top / "identity"
    kept.write_bytes(identity.read_bytes())
    identity.unlink()
    identity.symlink_to(kept)


def _identity_fifo(world: World) -> None:
    _fifo(world.control("identity"))


def _label_fifo(world: World) -> None:
    _fifo(world.control("label"))


def _mount_directory(world: World) -> None:
    _directory(world.control("mount"))


def _controls_a_file(world: World) -> None:
    controls = world.storage / "agent" / "coder.d"
    shutil.rmtree(controls)
    controls.write_text('{"uid": 65534, "gid": 65534, "groups": []}\n')
    controls.chmod(0o644)


def _nul_in_a_source(world: World) -> None:
    world.control("mount").write_text('[["/srv\\u0000x", "/data", "ro"]]\n')


AGENT_CONTROLS: dict[str, tuple[Callable[[World], None], int, str]] = {
    "an identity that is a link": (_identity_link, 1, f"agent/coder.d/identity {NOT_SAFE}"),
    "an identity that is a FIFO": (_identity_fifo, 1, f"agent/coder.d/identity {NOT_SAFE}"),
    "a control directory that is a file": (
        _controls_a_file,
        1,
        f"agent/coder.d/identity {NOT_SAFE}",
    ),
    "a mount table that is a directory": (_mount_directory, 3, f"agent/coder.d/mount {NOT_SAFE}"),
    "a mount source holding NUL": (
        _nul_in_a_source,
        3,
        "agent/coder.d/mount is invalid: mount entry 1: the source must be an absolute path, "
        "not '/srv\\x00x'",
    ),
    "a label that is a FIFO": (_label_fifo, 4, f"agent/coder.d/label {NOT_SAFE}"),
}


@needs_root
@pytest.mark.parametrize("case", sorted(AGENT_CONTROLS))
def test_an_agent_control_that_is_no_regular_file_denies_at_its_step_at_once(world, case):
    """P-5, docs/policy.md (*What the chain reads*: each control is reached one component at
    a time without following links and never waiting on a FIFO; "a control that is missing,
    malformed, a link or unreadable denies with EACCES"; the identity is step 1's, the mount
    table step 3's, the label step 4's): each such control denies at its step with EACCES
    naming it, within seconds, and explain writes nothing."""
    change, step, reason = AGENT_CONTROLS[case]
    change(world)
    before = snapshot(world.storage) if "FIFO" not in case else None
    started = time.monotonic()
    facts = world.verdict("tool:fs.read", "execute", timeout=20)
    assert time.monotonic() - started < 10
    denied_at(facts, step, "EACCES", reason)
    text = world.explain("tool:fs.read", "execute", timeout=20)
    assert text.rc == 1 and text.lines()[-1] == f"deny: EACCES: {facts['reason']}", text
    if before is not None:
        assert snapshot(world.storage) == before


# ------------------------------------------------------- who asks: another uid (P-5)

PRIVATE = {  # entry, its group and mode, what the asker may not do, the question
    "the identity": ("agent/coder.d/identity", 0, 0o600, "read", "shared:cortexfs-docs", "read"),
    "the mount table": ("agent/coder.d/mount", 0, 0o600, "read", "shared:cortexfs-docs", "read"),
    "the control directory": ("agent/coder.d", 0, 0o700, "enter", "shared:cortexfs-docs", "read"),
    "a model's own policy": ("model/acme/m1.d/policy", 0, 0o600, "read", "model:acme/m1", "use"),
    "a provider of the agent's group": (
        "model/acme",
        NOBODY,
        0o750,
        "enter",
        "model:acme/m1",
        "use",
    ),
}


@needs_root
@pytest.mark.parametrize("case", sorted(PRIVATE))
def test_a_user_who_may_not_read_what_decides_gets_no_verdict_but_eacces(world, case):
    """P-5, docs/policy.md (*What the chain reads*: the chain reads with the rights of the
    process that asks; ``ctx policy explain`` run by another user may be refused what the
    agent may read, which says nothing of the agent: "it then gives no verdict but exits 1
    naming what that user may not enter … or read", with owner, group and mode): root gets
    the verdict (allowed); uid 47930 gets EACCES naming the entry, no step on stdout, and
    with ``--json`` the error object alone."""
    entry, gid, mode, verb, obj, perm = PRIVATE[case]
    world.model()
    path = world.storage / entry
    os.chown(path, 0, gid)
    path.chmod(mode)
    assert world.verdict(obj, perm)["allowed"] is True

    said = (
        f"cannot judge whether agent 'coder' may {perm} {obj}: uid {ASKER} may not {verb} "
        f"{path} (owner uid 0, group {gid}, mode {mode:04o}); {NO_VERDICT.format(uid=ASKER)}"
    )
    text = world.as_uid(ASKER, "policy", "explain", "coder", obj, perm)
    refused(text, "EACCES", 1)
    assert text.out == "" and text.err.startswith(f"ctx: EACCES: {said}"), text
    as_json = world.as_uid(ASKER, "policy", "explain", "coder", obj, perm, "--json")
    assert refused_json(as_json, "EACCES", 1)["message"].startswith(said), as_json
