"""Every enumerated word of the specification and the docs, spelt otherwise, on every surface
where it is read: the states of ``ctx queue list --state``, the kinds of ``ctx queue work``,
the tiers ``system|user|shared:<name>`` (T-8), the keys and the ``move`` words of
``queue/config`` (§2.1, docs/queue.md "Configuration"), the statement, classes and
permissions of policy v0 (P-1..P-4, P-8), the fields and words of a v2 manifest (``manifest``,
``kind``, ``cap``, the ``mcp`` locator's ``transport``), the settings of a tool's ``status``
control (T-1), the keys and values of ``tool/tsh.d/config`` and of ``tsh.config`` (H-4),
``CTX_PATH=`` of ``.tshrc`` (T-4), the fields, mount modes and space permissions of an agent
request (A-3) and of the controls it writes, the request fields and ``created`` stamp of a
queue job (§2.1, Q-1), the ``status`` of a result (``ok|error``, Q-4, Q-6), a lease's
``boot_id`` and ``pid_ns`` (Q-3, Q-5), the ``encoding`` of ``fs.write`` and the ``control`` of
``agent.update`` (A-5), ``CTX_MODE``, the topics of ``ctx man`` (D-1), the MCP protocol
versions and server type of ``ctxmcp`` (M-1, M-2), and the durations, pids and counts of the
command line's options.

For each, the exact word works; the same word in another case, with blanks around it, with a
trailing dot or comma, with a look-alike letter (Cyrillic, fullwidth), a no-break space or a
zero-width joiner, abbreviated, in the plural, or a number where a word is expected, is
refused with a clear ``EINVAL`` naming the words accepted, or is accepted only where the
specification or the docs say that form is; it is never silently taken as another value or
silently ignored, and a refusal leaves nothing half-done.  The words the product writes
(native frames, session events, ``--json`` fields and states) are checked to be exactly the
documented ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
    rfc3339,
    scratch_top,
    snapshot,
    tool_manifest,
)

TOP = scratch_top(__file__)
CTXMCP = str(Path(CTX_ARGV[0]).with_name("ctxmcp"))
REQ = '{"tool":"fs.read","input":{}}'
NBSP, ZWJ, BOM = "\u00a0", "\u200d", "\ufeff"
LOOK_ALIKE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441", "p": "\u0440"}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: root")


# ---------------------------------------------------------------------------------- spellings


def fullwidth(word: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in word)


def cyrillic(word: str) -> str:
    """``word`` with its first letter that has a Cyrillic look-alike replaced by it."""
    for i, c in enumerate(word):
        if c in LOOK_ALIKE:
            return word[:i] + LOOK_ALIKE[c] + word[i + 1 :]
    raise AssertionError(f"{word!r} has no letter with a Cyrillic look-alike")


def otherwise(word: str, *left_out: str) -> dict[str, str]:
    """Telling spellings of ``word`` that are not ``word``, by what was done to it: another
    case, a trailing dot, a Cyrillic look-alike, a zero-width joiner, the plural, a number
    (``left_out``: kinds a surface documents as the same word)."""
    forms = {
        "capitalised": word[:1].upper() + word[1:],
        "trailing dot": word + ".",
        "cyrillic": cyrillic(word),
        "zero-width joiner": word[:1] + ZWJ + word[1:],
        "plural": word + "s",
        "number": "1",
    }
    return {k: v for k, v in forms.items() if k not in left_out and v != word}


def refused(r: Run, rc: int, errno_word: str, *named: str) -> None:
    """``r`` failed with exit ``rc`` and a ``ctx: ERRNO:`` line naming each of ``named``, no
    traceback."""
    assert r.rc == rc, r
    assert f": {errno_word}: " in r.err and "Traceback" not in r.err, r
    for word in named:
        assert word in r.err, (word, r)


@pytest.fixture
def scratch():
    made = new_scratch_dir(TOP)
    yield made
    shutil.rmtree(made, ignore_errors=True)


# -------------------------------------------------------------------------- a host with agents


@dataclass
class Host(OnStorage):
    """A storage root every uid may search, with agent ``ci`` (label ``ci_t``, root's default
    uid ``nobody``) whose request listed ``tools``; nothing granted on the tools' side."""

    storage: Path
    scratch: Path
    uid: int

    def install(self, name: str, program: str) -> None:
        manifest = tool_manifest(self.scratch / "manifests", name, program)
        installed = self.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed

    def grant(self, *tools: str) -> None:
        self.allow_tool("ci_t", *tools)

    def native(self, tool: str, value: object, session: str = "s1") -> dict:
        r = self.ctx(
            "run", "--agent", "ci", "--native", "--session", session, tool, input=json.dumps(value)
        )
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return frames[-1]

    def events(self, session: str) -> list[dict]:
        path = self.storage / "home" / str(self.uid) / "agent" / "ci" / "session" / session
        return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]


def make_host(storage: Path, scratch: Path, tools: list[str], **request) -> Host:
    env = clean_env(CTX_STORAGE=str(storage))
    body = {"name": "ci", "label": "ci_t", "tools": tools, **request}
    made = ctx_run("agent", "create", "-", "--json", input=json.dumps(body), env=env)
    assert made.rc == 0, made
    return Host(storage, scratch, made.json()["identity"]["uid"])


# ====================================================================== options of the command


def test_queue_list_state_takes_its_six_words_and_no_other_spelling(queue):
    """§2.4, ``ctx queue list --help``: ``--state`` is one of pending, claimed, done, failed,
    incomplete, conflict.  The exact word lists the pending job; every other spelling is a
    usage error (exit 2) with ``EINVAL`` naming the six words, and with ``--json`` also one error
    object on stdout whose message is the one of stderr (docs/queue.md)."""
    job = queue.publish()
    listed = queue.run("list", "--state", "pending")
    assert listed.rc == 0 and listed.lines() == [job], listed
    spellings = otherwise("pending", "trailing dot")
    spellings.update({"upper": "PENDING", "blank": " pending", "fullwidth": fullwidth("pending")})
    for how, spelling in spellings.items():
        r = queue.run("list", "--state", spelling)
        refused(r, 2, "EINVAL", "'pending', 'claimed', 'done', 'failed'")
        assert r.out == "", (how, r)
    as_json = queue.run("list", "--state", "pending.", "--json")
    error = as_json.json()
    assert as_json.rc == 2 and (error["error"], error["errno"]) == ("EINVAL", 22), as_json
    assert f"ctx: EINVAL: {error['message']}" in as_json.err and "'claimed'" in error["message"]


def test_queue_work_kind_is_tool_or_shell_and_a_misspelt_kind_claims_nothing(queue):
    """docs/workers.md: ``--kind`` is ``tool`` or ``shell``.  ``Tool``, ``SHELL``, ``shell ``,
    ``sh`` and ``shells`` are usage errors (EINVAL naming both words, exit 2) before anything is
    claimed: the pending job stays pending, with no lease."""
    job = queue.publish()
    for spelling in ("Tool", "SHELL", "shell ", "sh", "shells", "t\u043e\u043el", "1"):
        r = queue.run("work", "--kind", spelling, "--drain", "--max-jobs", "1")
        refused(r, 2, "EINVAL", "'tool', 'shell'")
    assert queue.state(job) == "pending" and queue.entries("lease") == set()


def test_durations_of_options_are_plain_numbers_of_seconds(queue, child):
    """``--ttl``, ``--grace``, ``--timeout`` (``ctx queue claim|work|recover``, ``ctx run``,
    ``ctxmcp``) take a number of seconds: a unit (``10s``, ``1m``, ``30s``), fullwidth or
    Arabic-Indic digits, ``1_0``, a no-break space, ``nan`` or ``inf`` are EINVAL (exit 2), and
    nothing is claimed; ``10`` leases for exactly ten seconds."""
    job = queue.publish()
    for spelling in ("10s", fullwidth("10"), "1_0", "10" + NBSP, "nan"):
        claim = queue.run("claim", "--pid", str(child.pid), "--ttl", spelling)
        refused(claim, 2, "EINVAL", "--ttl", "is not a")
    for spelling in ("1m", "inf"):
        refused(queue.run("recover", "--grace", spelling), 2, "EINVAL", "--grace")
    env = clean_env(CTX_STORAGE=str(queue.storage))
    for argv in (
        ("queue", "work", "--project", "proj", "--timeout", "5s", "--drain"),
        ("run", "--agent", "ghost", "--timeout", fullwidth("5"), "fs.read"),
    ):
        refused(ctx_run(*argv, env=env), 2, "EINVAL", "--timeout")
    mcp = subprocess.run(
        [CTXMCP, "list", "--config", "/nonexistent.json", "--server", "s", "--timeout", "30s"],
        capture_output=True,
        text=True,
    )
    assert mcp.returncode == 2 and "EINVAL" in mcp.stderr and "Traceback" not in mcp.stderr
    assert queue.state(job) == "pending" and queue.entries("lease") == set()
    assert queue.claim("--pid", str(child.pid), "--ttl", "10") == job
    lease = queue.lease(job)
    period = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert period.total_seconds() == pytest.approx(10, abs=0.01), lease


def test_pids_uids_and_counts_are_decimal_digits_only(queue, child):
    """``--pid``, ``--uid``, ``-n``: fullwidth digits, a sign, ``_``, a fraction, a blank or a
    zero-width joiner are EINVAL (exit 2), never read as the number they look like; nothing is
    claimed."""
    job = queue.publish()
    pid = str(child.pid)
    for spelling in (fullwidth(pid), "+" + pid, pid + ".0", " " + pid, pid[:1] + ZWJ + pid[1:]):
        refused(queue.run("claim", "--pid", spelling), 2, "EINVAL", "--pid", "decimal digits")
    assert queue.state(job) == "pending" and queue.entries("lease") == set()
    env = clean_env(CTX_STORAGE=str(queue.storage))
    for args in (("-n", fullwidth("5")), ("--uid", "1_0")):
        refused(ctx_run("session", "tail", "ci", *args, env=env), 2, "EINVAL", "decimal digits")


# ================================================================================ queue/config


def test_config_key_spelt_otherwise_is_refused_naming_the_keys(queue):
    """docs/queue.md "Configuration": unknown keys are refused with EINVAL and the line number.
    ``Lease_ttl``, ``LEASE_TTL``, ``lease-ttl``, look-alikes and the like are unknown keys, never
    ``lease_ttl`` and never passed over: every command that opens the queue refuses (exit 1)
    naming the file, the line and the known keys, and publish leaves nothing behind."""
    config = queue.dir / "config"
    original = config.read_bytes()
    spellings = otherwise("lease_ttl")
    spellings.update({"upper": "LEASE_TTL", "hyphen": "lease-ttl"})
    for key in spellings.values():
        config.write_text(f"# edited\n{key}=10\n")
        r = queue.run("status")
        refused(r, 1, "EINVAL", f"{config}:2", "unknown key", "lease_ttl, grace, move")
    config.write_text("Lease_TTL=10\n")
    before = snapshot(queue.dir)
    for args in (("publish", "-"), ("claim",)):
        r = queue.run(*args, input=REQ)
        refused(r, 1, "EINVAL", "unknown key 'Lease_TTL'")
        assert r.out == "", r
    assert snapshot(queue.dir) == before
    config.write_bytes(original)
    assert queue.run("status").rc == 0


def test_config_move_is_rename_or_link_and_nothing_else(queue, child):
    """docs/queue.md: ``move`` is ``rename`` or ``link``.  Any other spelling is EINVAL naming
    both words and the line; both exact words let a job be published and claimed."""
    config = queue.dir / "config"
    for word in [*otherwise("rename").values(), "LINK"]:
        config.write_text(f"move={word}\n")
        r = queue.run("status")
        refused(r, 1, "EINVAL", f"{config}:1", "move must be 'rename' or 'link'")
    for word in ("rename", "link"):
        config.write_text(f"move={word}\n")
        job = queue.publish()
        assert queue.claim("--pid", str(child.pid)) == job
        assert queue.state(job) == "claimed"


def test_config_numbers_spelt_otherwise_are_refused_and_exact_ones_honoured(queue, child):
    """docs/queue.md: ``lease_ttl`` and ``grace`` are seconds, the two limits positive integers
    of bytes: a unit, fullwidth or Arabic-Indic digits, ``1_000``, ``nan`` or an exponent where
    an integer is wanted are EINVAL naming the key and the value.  The exact spellings work:
    ``max_request_bytes=40`` takes a request of 40 bytes and refuses 41 with EFBIG, and
    ``lease_ttl=7`` makes a claim lease for seven seconds."""
    config = queue.dir / "config"
    cases = [("lease_ttl", v) for v in ("10s", fullwidth("10"), "nan")]
    cases += [("max_request_bytes", v) for v in ("1KiB", "1e3", "1_000")]
    cases += [("grace", v) for v in ("1m", "\u0661")]
    for key, value in cases:
        config.write_text(f"{key}={value}\n")
        r = queue.run("status")
        refused(r, 1, "EINVAL", f"{config}:1", key, repr(value))
    config.write_text("max_request_bytes=40\nlease_ttl=7\n")
    at_limit = REQ + " " * (40 - len(REQ))
    assert queue.run("publish", "--name", "fits", "-", input=at_limit).rc == 0
    over = queue.run("publish", "--name", "over", "-", input=at_limit + " ")
    refused(over, 1, "EFBIG", "max_request_bytes")
    assert queue.claim("--pid", str(child.pid)) == "fits.req.json"
    lease = queue.lease("fits.req.json")
    period = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert period.total_seconds() == pytest.approx(7, abs=0.01), lease


# ==================================================================================== policy v0


def check_policy(directory: Path, text: str) -> tuple[Run, dict]:
    path = directory / "edited.policy"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    r = ctx_run("policy", "check", "--json", path)
    return r, r.json()


def test_policy_statement_and_line_breaks_spelt_otherwise_make_an_invalid_line(tmp_path):
    """P-1, P-2, docs/policy.md: a rule is ``allow SUBJECT CLASS:NAME PERM``, four words in
    printable ASCII separated by spaces or tabs, one per line.  ``Allow``, ``ALLOW``,
    ``allow.``, ``allows``, a Cyrillic ``а``, a fullwidth word, a no-break space or a
    zero-width joiner in it, and ``Deny`` are each an invalid line 1 (EINVAL, exit 1), never a
    rule and never skipped; two rules joined by U+2028, NEL or a lone CR are one
    invalid line, never two rules."""
    good, report = check_policy(tmp_path, "allow a_t tool:x execute\n")
    assert good.rc == 0 and report["valid"] is True, good
    lines = [f"{word} a_t tool:x execute" for word in otherwise("allow", "number").values()]
    lines += [f"{word} a_t tool:x execute" for word in ("ALLOW", fullwidth("allow"), "Deny")]
    lines.append(f"allow{NBSP}a_t tool:x execute")
    joined = "allow a_t tool:x execute{}allow b_t tool:y execute"
    lines += [joined.format(sep) for sep in ("\u2028", "\u0085", "\r")]
    for line in lines:
        r, report = check_policy(tmp_path, line + "\n")
        assert r.rc == 1 and report["valid"] is False, (line, r)
        (problem,) = report["files"][0]["problems"]
        assert problem["line"] == 1 and problem["error"] == "EINVAL", (line, problem)
        assert ":1: EINVAL: " in r.err, (line, r)


def test_policy_class_spelt_otherwise_is_refused_naming_the_classes(tmp_path):
    """P-3, P-4: the classes are tool, model, shared, session, mount, agent, network; ``Tool``,
    ``TOOL``, ``tools``, ``tool.`` are unknown classes (EINVAL naming the seven);
    ``network:Default`` and ``network:defaults`` are no network object (only ``default``,
    P-4); a fullwidth colon or a look-alike letter is not ASCII."""
    for klass in ("Tool", "TOOL", "tools", "tool."):
        r, _ = check_policy(tmp_path, f"allow a_t {klass}:x execute\n")
        refused(r, 1, "EINVAL", f"unknown class '{klass}'", "tool, model, shared, session, mount")
    for obj in ("Default", "defaults"):
        r, _ = check_policy(tmp_path, f"allow a_t network:{obj} connect\n")
        refused(r, 1, "EINVAL", "the only network object is 'default'")
    for rule in ("allow a_t tool\uff1ax execute", f"allow a_t {cyrillic('tool')}:x execute"):
        r, _ = check_policy(tmp_path, rule + "\n")
        refused(r, 1, "EINVAL", "ASCII")
    ok, _ = check_policy(tmp_path, "allow a_t network:default connect\n")
    assert ok.rc == 0, ok


def test_policy_permission_spelt_otherwise_is_refused_naming_the_class_permissions(tmp_path):
    """P-3: each class has fixed permissions; ``Execute``, ``execute.``, ``exec``,
    ``executes``, ``1`` for tool, ``READ`` for mount, ``Connect`` for network, ``resumes`` for
    session are unknown permissions, each named with the words its class has."""
    for word in ("Execute", "execute.", "exec", "executes", "1"):
        r, _ = check_policy(tmp_path, f"allow a_t tool:x {word}\n")
        refused(r, 1, "EINVAL", f"unknown permission '{word}'", "tool has execute")
    for obj, word, has in (
        ("mount:ctx", "READ", "mount has read, write"),
        ("network:default", "Connect", "network has connect"),
        ("session:s", "resumes", "session has read, write, resume"),
    ):
        r, _ = check_policy(tmp_path, f"allow a_t {obj} {word}\n")
        refused(r, 1, "EINVAL", f"unknown permission '{word}'", has)


def test_policy_query_and_explain_refuse_words_spelt_otherwise(storage):
    """P-8: a malformed query is exit 2 with EINVAL, a rule not held is ``deny`` (exit 1).
    ``Tool:x``, ``Execute``, ``network:Default`` and a permission with a no-break space are
    malformed; a subject or name in another case is another name (R-3 names are
    case-sensitive): ``deny``, never ``allow``."""
    policy = storage.parent / "q.policy"
    policy.write_text("allow a_t tool:x execute\nallow a_t network:default connect\n")
    env = clean_env(CTX_STORAGE=str(storage))

    def query(*words: str) -> Run:
        return ctx_run("policy", "query", "--policy", policy, *words, env=env)

    allowed = query("a_t", "tool:x", "execute")
    assert allowed.rc == 0 and allowed.out == "allow\n", allowed
    for words in (
        ("a_t", "Tool:x", "execute"),
        ("a_t", "tool:x", "Execute"),
        ("a_t", "network:Default", "connect"),
        ("a_t", "tool:x", "execute" + NBSP),
    ):
        refused(query(*words), 2, "EINVAL")
    for words in (("A_t", "tool:x", "execute"), ("a_t", "tool:X", "execute")):
        denied = query(*words)
        assert denied.rc == 1 and denied.out == "deny\n", denied
    refused(ctx_run("policy", "explain", "ci", "Tool:fs.read", "execute", env=env), 2, "EINVAL")


@needs_root
def test_agent_policy_with_a_misspelt_allow_grants_nothing_and_says_which_line(
    searchable_storage, scratch
):
    """P-1, docs/policy.md "Validity": a policy with any invalid line is invalid as a whole and
    grants nothing.  The agent's policy with its first rule turned into ``Allow`` is not read as
    a deny of that one rule: the explanation denies at step 5 with EACCES naming the policy,
    its line and that an invalid policy grants nothing, for every rule of the file."""
    host = make_host(searchable_storage, scratch, ["fs.read", "fs.list"])
    host.grant("fs.read", "fs.list")
    explained = host.ctx("policy", "explain", "ci", "tool:fs.list", "execute")
    assert explained.rc == 0 and explained.lines()[-1] == "allow", explained
    policy = host.storage / "agent" / "ci.d" / "policy"
    lines = policy.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("allow "))
    lines[first] = "Allow" + lines[first][len("allow") :]
    policy.write_text("\n".join(lines) + "\n")
    for tool in ("fs.read", "fs.list"):
        r = host.ctx("policy", "explain", "ci", f"tool:{tool}", "execute", "--json")
        verdict = r.json()
        assert r.rc == 1 and verdict["allowed"] is False and verdict["step"] == 5, r
        assert verdict["errno"] == "EACCES", verdict
        assert f"policy:{first + 1}" in verdict["reason"] and "Allow" in verdict["reason"], verdict
        assert "grants nothing" in verdict["reason"], verdict


# ================================================================================= manifests


def check_manifest(directory: Path, document: dict | str) -> Run:
    (directory / "t.sh").write_text("#!/bin/sh\ncat\n")
    path = directory / "m.json"
    text = document if isinstance(document, str) else json.dumps(document)
    path.write_text(text)
    return ctx_run("object", "check", path)


def manifest(**changes) -> dict:
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "t.x",
        "description": "d",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": "t.sh",
    }
    document.update(changes)
    return document


def test_manifest_kind_version_and_field_names_spelt_otherwise(storage, scratch):
    """T-8, docs/tools.md: ``kind`` is ``"tool"`` and ``manifest`` the number 2.  Every other
    spelling of ``tool`` (case, dot, plural, look-alikes, a number) is EINVAL saying ``'tool'
    was expected`` (exit 1); ``"2"`` and ``true`` are no 2; a field name in another case
    (``Name``, ``Program``) is no field of a v2 manifest, and ``object install`` of such a
    manifest installs nothing."""
    good = check_manifest(scratch, manifest())
    assert good.rc == 0 and good.out == f"{scratch / 'm.json'}: valid (t.x)\n", good
    for word in [*otherwise("tool").values(), " tool"]:
        r = check_manifest(scratch, manifest(kind=word))
        refused(r, 1, "EINVAL", "kind: 'tool' was expected")
    for value in ("2", True):
        r = check_manifest(scratch, manifest(manifest=value))
        refused(r, 1, "EINVAL", "manifest: 2 was expected")
    renamed = manifest()
    renamed["Name"] = renamed.pop("name")
    refused(check_manifest(scratch, renamed), 1, "EINVAL", "'Name' was unexpected")
    r = check_manifest(scratch, manifest(Program={"type": "object"}))
    refused(r, 1, "EINVAL", "'Program' was unexpected", "a v2 manifest has no such field")
    check_manifest(scratch, manifest(kind="Tool"))
    before = snapshot(storage / "tool")
    r = ctx_run("object", "install", scratch / "m.json", "--tier", "system", "--storage", storage)
    refused(r, 1, "EINVAL", "kind")
    assert snapshot(storage / "tool") == before


def test_manifest_cap_facts_are_booleans_and_other_cases_are_facts_of_their_own(storage, scratch):
    """docs/tools.md: ``side_effects`` and ``network``, when present, are booleans: ``"false"``,
    ``0``, ``null``, ``"False"``, ``1`` are refused naming the fact, never read as the boolean
    they look like.  Any other key is a fact of one's own, and a fact left out counts as the
    cautious value: ``{"Side_Effects": false, "NETWORK": false}`` installs, and its ``cap``
    control keeps those keys as written, never turned into ``side_effects``/``network``."""
    for fact, value in (
        ("side_effects", "false"),
        ("side_effects", 0),
        ("side_effects", None),
        ("network", "False"),
        ("network", 1),
    ):
        cap = {"side_effects": False, "network": False, fact: value}
        r = check_manifest(scratch, manifest(cap=cap))
        refused(r, 1, "EINVAL", f"cap/{fact}", "is not of type 'boolean'")
    assert check_manifest(scratch, manifest(cap={"Side_Effects": False, "NETWORK": False})).rc == 0
    r = ctx_run("object", "install", scratch / "m.json", "--tier", "system", "--storage", storage)
    assert r.rc == 0, r
    cap = json.loads((storage / "tool" / "t.x.d" / "cap").read_text())
    assert cap == {"Side_Effects": False, "NETWORK": False}, cap


def test_manifest_mcp_transport_is_stdio_and_nothing_else(scratch):
    """M-1, M-4, docs/tools.md: the ``mcp`` locator's ``transport`` is ``"stdio"``; ``Stdio``,
    ``stdio.``, a look-alike, a zero-width joiner, ``stdios``, a number and ``sse`` are EINVAL
    saying ``'stdio' was expected``; a locator key in another case is no key of it."""
    config = scratch / "mcp.json"
    config.write_text('{"mcpServers": {"gh": {"command": "/bin/true"}}}')

    def locator(**changes) -> dict:
        mcp = {"transport": "stdio", "config": str(config), "server": "gh", "tool": "search"}
        mcp.update(changes)
        document = manifest(name="gh.search", mcp=mcp)
        del document["exec"]
        return document

    assert check_manifest(scratch, locator()).rc == 0
    spellings = otherwise("stdio")
    spellings["sse"] = "sse"
    for word in spellings.values():
        r = check_manifest(scratch, locator(transport=word))
        refused(r, 1, "EINVAL", "mcp/transport: 'stdio' was expected")
    document = locator()
    document["mcp"]["Transport"] = document["mcp"].pop("transport")
    refused(check_manifest(scratch, document), 1, "EINVAL", "'Transport' was unexpected")


def test_tier_spelt_otherwise_is_a_usage_error_and_installs_nothing(storage, scratch):
    """T-8, ``ctx object install|list --help``: ``--tier system|user|shared:<name>``.  Other
    spellings of ``system`` and ``user``, a ``Shared:`` prefix, ``shared`` alone and ``user:0``
    are EINVAL (exit 2) naming the three forms, with nothing installed in any tier, and the same
    for ``object list``; ``shared:Proj`` names a space that does not exist (ENOENT), never
    ``proj``.  The three exact forms install."""
    document = tool_manifest(scratch, "t.y", "#!/bin/sh\ncat\n")
    tiers = [storage / "tool", storage / "shared" / "proj" / "tool"]
    before = {str(t): snapshot(t) for t in tiers}
    for word in ("System", cyrillic("system"), "User", "Shared:proj", "user:0"):
        r = ctx_run("object", "install", document, "--tier", word, "--storage", storage)
        refused(r, 2, "EINVAL", "system, user or shared:<name>")
    assert {str(t): snapshot(t) for t in tiers} == before
    assert not (storage / "home" / str(os.geteuid()) / "tool" / "t.y").exists()
    env = clean_env(CTX_STORAGE=str(storage))
    for word in (fullwidth("system"), "users"):
        listed = ctx_run("object", "list", "--tier", word, env=env)
        refused(listed, 2, "EINVAL", "system, user or shared:<name>")
    refused(ctx_run("object", "list", "--tier", "shared:Proj", env=env), 1, "ENOENT", "Proj")
    for tier, where in (
        ("system", storage / "tool"),
        ("user", storage / "home" / str(os.geteuid()) / "tool"),
        ("shared:proj", storage / "shared" / "proj" / "tool"),
    ):
        r = ctx_run("object", "install", document, "--tier", tier, "--storage", storage)
        assert r.rc == 0 and (where / "t.y").is_file(), r


# ======================================================================== the status control


def object_status(storage: Path, name: str) -> dict:
    r = ctx_run("object", "list", "--tier", "system", "--json", "--storage", storage)
    assert r.rc == 0, r
    (entry,) = [t for t in r.json() if t["name"] == name]
    return entry


def test_status_control_takes_its_three_settings_and_refuses_every_other_spelling(storage):
    """T-1, docs/tools.md: ``status`` reads ``available``, ``disabled`` or ``unavailable:
    <reason>``; one reading none of them (``Available``, empty) is unavailable and refuses
    calls, the control quoted.  ``Disabled``, a look-alike, a zero-width joiner, a byte order
    mark, a trailing comment or two settings are none of the three: never ``available``."""
    status = storage / "tool" / "fs.stat.d" / "status"
    for text, expected, reason in (
        ("available\n", "available", ""),
        ("disabled\n", "disabled", ""),
        ("unavailable: maintenance\n", "unavailable", "maintenance"),
    ):
        status.write_text(text)
        entry = object_status(storage, "fs.stat")
        assert (entry["status"], entry["reason"]) == (expected, reason), entry
    for text in (
        "Available",
        "Disabled",
        "available" + ZWJ,
        BOM + "available",
        "available # ok",
        cyrillic("available"),
        "available\ndisabled",
    ):
        status.write_text(text + "\n")
        entry = object_status(storage, "fs.stat")
        assert entry["status"] == "unavailable", (text, entry)
        assert "which is not available, disabled or unavailable" in entry["reason"], (text, entry)


@needs_root
def test_a_call_meets_a_misspelt_status_as_a_refusal(searchable_storage, scratch):
    """T-1: a call is refused (EACCES) unless the status reads ``available``; ``Available``
    refuses the call before the tool runs, and the exact word lets it run."""
    host = make_host(searchable_storage, scratch, ["fs.stat"])
    host.grant("fs.stat")
    status = host.storage / "tool" / "fs.stat.d" / "status"
    status.write_text("Available\n")
    result = host.native("fs.stat", {"path": "/ctx/tool"})
    assert result["status"] == "error" and result["error"]["error"] == "EACCES", result
    assert result["exit_status"] is None and "Available" in result["error"]["message"], result
    status.write_text("available\n")
    assert host.native("fs.stat", {"path": "/ctx/tool"})["status"] == "ok"


# ============================================================================= tsh's settings


def test_tsh_config_settings_spelt_otherwise_change_nothing(storage):
    """H-4, docs/tools.md: an update of ``tsh.config`` is validated whole (known keys, positive
    integers) before anything is written: a key in another case, with a trailing dot, a
    look-alike, a zero-width joiner or in the plural, a value with fullwidth digits, a
    fraction, ``_`` or ``%``, a JSON ``Set`` or ``true`` is EINVAL, exit 2, naming the known
    settings or the value, and ``tool/tsh.d/config`` is left byte for byte as it was."""
    config = storage / "tool" / "tsh.d" / "config"
    original = config.read_bytes()
    env = clean_env(CTX_STORAGE=str(storage))
    for key in otherwise("cache_capacity", "number").values():
        r = ctx_run("tool", "tsh.config", f"{key}=33", "window_percent=2", env=env)
        refused(r, 2, "EINVAL", "known: max_loaded_tools, cache_capacity, window_percent")
    for value in (fullwidth("33"), "33.0", "3_3", "1%"):
        r = ctx_run("tool", "tsh.config", f"cache_capacity={value}", env=env)
        refused(r, 2, "EINVAL", "cache_capacity must be a positive integer")
    for document in ({"Set": {"cache_capacity": 33}}, {"set": {"cache_capacity": True}}):
        r = ctx_run("tool", "--json", "tsh.config", json.dumps(document), env=env)
        refused(r, 2, "EINVAL")
        assert r.json()["error"] == "EINVAL", (document, r)
    assert config.read_bytes() == original
    done = ctx_run("tool", "tsh.config", "cache_capacity=33", env=env)
    assert done.rc == 0 and "cache_capacity=33" in config.read_text(), done


def test_tsh_config_setting_given_as_a_string_of_digits_is_its_number(storage):
    """H-4, docs/tools.md: the settings of ``set`` are positive integers, in JSON a number or a
    string of decimal digits taken as the number it spells (as a ``key=value`` word is):
    ``"040"`` sets 40; a string that spells no number is EINVAL, exit 2, nothing changed."""
    config = storage / "tool" / "tsh.d" / "config"
    env = clean_env(CTX_STORAGE=str(storage))
    for value in ("4x", "", " 40", "\uff14\uff10"):
        original = config.read_bytes()
        r = ctx_run(
            "tool", "--json", "tsh.config", json.dumps({"set": {"cache_capacity": value}}), env=env
        )
        refused(r, 2, "EINVAL", "cache_capacity")
        assert config.read_bytes() == original
    r = ctx_run("tool", "--json", "tsh.config", '{"set": {"cache_capacity": "040"}}', env=env)
    assert r.rc == 0, r
    assert "cache_capacity=40" in config.read_text().splitlines(), config.read_text()


def test_tsh_config_file_line_spelt_otherwise_is_warned_and_blocks_updates(storage):
    """docs/spec/ctx.coreutils.md: a malformed line of ``tool/tsh.d/config`` keeps its key's
    default, is warned of on a read, reported by ``ctx bootstrap`` (exit 1), and must be fixed
    by hand before an update (EINVAL, exit 1).  ``Cache_Capacity=99``, ``cache_capacity=９９``,
    ``cache_capacity=99.`` and a byte order mark before the key are each such a line: the
    effective value stays 32, never 99."""
    config = storage / "tool" / "tsh.d" / "config"
    env = clean_env(CTX_STORAGE=str(storage))
    for line in (
        "Cache_Capacity=99",
        f"cache_capacity={fullwidth('99')}",
        "cache_capacity=99.",
        BOM + "cache_capacity=99",
        "cache_capacity=99 # comment",
    ):
        config.write_text(f"max_loaded_tools=64\n{line}\nwindow_percent=1\n")
        read = ctx_run("tool", "--json", "tsh.config", env=env)
        assert read.rc == 0, read
        answer = read.json()
        assert answer["config"]["cache_capacity"] == 32, (line, answer)
        (warning,) = answer["warnings"]
        assert warning.startswith("tsh.d/config:2: ") and "the default applies" in warning, answer
        edited = config.read_bytes()
        update = ctx_run("tool", "tsh.config", "window_percent=2", env=env)
        refused(update, 1, "EINVAL")
        assert config.read_bytes() == edited
    boot = ctx_run("bootstrap", "--storage", storage)
    refused(boot, 1, "EINVAL", "tool/tsh.d/config:2")


def test_tshrc_key_spelt_otherwise_is_never_ctx_path(storage, scratch):
    """T-4, docs/tools.md: ``.tshrc`` gives the search path with ``CTX_PATH=``; keys are
    case-sensitive names of the environment.  ``ctx_path=``, ``Ctx_Path=`` and ``CTX_PATHS=``
    do not set the path (the default applies); ``CTX-PATH=``, a Cyrillic ``Р``
    and a byte order mark make a line that is no ``KEY=VALUE``, ignored with a warning naming
    the file and the line.  The exact key finds the tool there."""
    alt, home = scratch / "alt", scratch / "home"
    alt.mkdir()
    home.mkdir()
    (alt / "zz.x").write_text("#!/bin/sh\n")
    (alt / "zz.x").chmod(0o755)
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home))
    tshrc = home / ".tshrc"

    def which(line: str) -> Run:
        tshrc.write_text(f"{line}={alt}\n")
        return ctx_run("object", "which", "zz.x", env=env)

    found = which("CTX_PATH")
    assert found.rc == 0 and found.out == f"{alt / 'zz.x'}\n", found
    for key in ("ctx_path", "Ctx_Path", "CTX_PATHS"):
        r = which(key)
        refused(r, 1, "ENOENT", "zz.x is not on CTX_PATH (/ctx/tool:")
    for key in ("CTX-PATH", "CTX_\u0420ATH", BOM + "CTX_PATH"):
        r = which(key)
        assert r.rc == 1 and f"{tshrc}:1: ignored, not KEY=VALUE" in r.err, (key, r)


# ================================================================ agent requests and controls


def create(storage: Path, body: dict) -> Run:
    return ctx_run(
        "agent",
        "create",
        "-",
        "--json",
        input=json.dumps(body),
        env=clean_env(CTX_STORAGE=str(storage)),
    )


def rules_of(storage: Path, agent: str) -> list[str]:
    policy = (storage / "agent" / f"{agent}.d" / "policy").read_text()
    return [line for line in policy.splitlines() if line.startswith("allow ")]


@needs_root
def test_agent_request_mount_mode_spelt_otherwise_creates_no_agent(searchable_storage, scratch):
    """A-3, docs/tools.md: a mount is ``[source, target, "ro"|"rw"]``.  Every other spelling of
    ``ro`` (``Ro``, ``ro.``, a look-alike, a zero-width joiner, ``ros``, ``readonly``,
    a number, ``true``) is EINVAL
    naming ``['ro', 'rw']`` (exit 1), and no ``agent/NAME`` nor ``agent/NAME.d`` is made.
    ``ro`` grants ``mount:src read`` only, ``rw`` read and write."""
    source = scratch / "src"
    source.mkdir(mode=0o755)
    for n, word in enumerate([*otherwise("ro").values(), "readonly", True]):
        r = create(
            searchable_storage,
            {"name": f"m{n}", "label": "m_t", "mount": [[str(source), "/src", word]]},
        )
        refused(r, 1, "EINVAL", "is not one of ['ro', 'rw']")
        assert not (searchable_storage / "agent" / f"m{n}").exists()
        assert not (searchable_storage / "agent" / f"m{n}.d").exists()
    for name, word, expected in (("ro1", "ro", ["read"]), ("rw1", "rw", ["read", "write"])):
        made = create(
            searchable_storage,
            {"name": name, "label": f"{name}_t", "mount": [[str(source), "/src", word]]},
        )
        assert made.rc == 0, made
        granted = [r.split()[-1] for r in rules_of(searchable_storage, name) if "mount:src" in r]
        assert granted == expected, granted


@needs_root
def test_agent_request_space_permission_spelt_otherwise_creates_no_agent(
    searchable_storage, scratch
):
    """A-3, docs/tools.md: a space's permissions are a list or a string of ``read`` and
    ``write`` separated by spaces.  ``Read``, ``read.``, a look-alike, a zero-width joiner,
    ``reads``, a number, ``rw``, ``read,write`` and ``Read Write`` are
    EINVAL naming ``['read', 'write']`` and create nothing; the documented ``"read write"``
    grants exactly both."""
    values = [[word] for word in otherwise("read").values()]
    values += ["rw", "read,write", "Read Write"]
    for n, value in enumerate(values):
        r = create(searchable_storage, {"name": f"s{n}", "label": "s_t", "shared": {"proj": value}})
        refused(r, 1, "EINVAL", "is not one of ['read', 'write']")
        assert not (searchable_storage / "agent" / f"s{n}").exists()
    made = create(
        searchable_storage, {"name": "both", "label": "both_t", "shared": {"proj": "read write"}}
    )
    assert made.rc == 0, made
    assert [r for r in rules_of(searchable_storage, "both") if "shared:" in r] == [
        "allow both_t shared:proj read",
        "allow both_t shared:proj write",
    ]


def test_agent_request_field_names_spelt_otherwise_are_refused(storage):
    """A-3: the request's fields are ``name``, ``label``, ``model``, ``tools``, ``shared``,
    ``mount``.  ``Name``, ``Label``, ``Tools``, ``tool``, ``mounts``, ``models`` are no field:
    EINVAL naming the one unexpected, and nothing is created; ``tools`` given as a word instead
    of a list is refused too."""
    for field, renamed in (
        ("name", "Name"),
        ("label", "Label"),
        ("tools", "Tools"),
        ("tools", "tool"),
        ("mount", "mounts"),
        ("model", "models"),
    ):
        body = {"name": "f1", "label": "f1_t", "tools": [], "mount": [], "model": []}
        body[renamed] = body.pop(field)
        r = create(storage, body)
        refused(r, 1, "EINVAL", f"'{renamed}' was unexpected")
        assert not (storage / "agent" / "f1").exists()
    refused(
        create(storage, {"name": "f2", "label": "f2_t", "tools": "fs.read"}),
        1,
        "EINVAL",
        "is not of type 'array'",
    )


@needs_root
def test_hand_edited_mount_mode_and_label_spelt_otherwise_grant_nothing(
    searchable_storage, scratch
):
    """docs/policy.md, docs/tools.md: a mount control whose mode is not ``ro`` or ``rw``
    (``RO``, ``ro`` with a no-break space, ``true``) is unusable and grants nothing
    (``ctx agent show`` names it a problem, with no mount); a label with a no-break space, a
    zero-width joiner or a byte order mark is no subject type (step 4 denies, EACCES), and
    ``CI_T`` is another label than ``ci_t`` (step 5 denies: the policy names ``ci_t``)."""
    source = scratch / "src"
    source.mkdir(mode=0o755)
    host = make_host(searchable_storage, scratch, ["fs.read"], mount=[[str(source), "/src", "ro"]])
    host.grant("fs.read")
    controls = host.storage / "agent" / "ci.d"
    mount_control = json.loads((controls / "mount").read_text())
    for mode in ("RO", "ro" + NBSP, True):
        edited = [[mount_control[0][0], "/src", mode], mount_control[1]]
        (controls / "mount").write_text(json.dumps(edited))
        shown = host.ctx("agent", "show", "ci", "--json").json()
        assert shown["mounts"] == [], (mode, shown)
        assert any("must be 'ro' or 'rw'" in p for p in shown["problems"]), (mode, shown)
    (controls / "mount").write_text(json.dumps(mount_control))
    for label, step in (
        ("ci_t" + NBSP, 4),
        ("ci" + ZWJ + "_t", 4),
        (BOM + "ci_t", 4),
        ("CI_T", 5),
    ):
        (controls / "label").write_text(label + "\n")
        r = host.ctx("policy", "explain", "ci", "tool:fs.read", "execute", "--json")
        verdict = r.json()
        assert r.rc == 1 and (verdict["step"], verdict["errno"]) == (step, "EACCES"), (label, r)
    (controls / "label").write_text("ci_t\n")
    assert host.ctx("policy", "explain", "ci", "tool:fs.read", "execute").rc == 0


# ===================================================================== requests, results, leases


def test_created_with_blanks_around_the_stamp_is_not_rfc3339(queue):
    """§2.1, docs/queue.md: a ``created`` given must be an RFC 3339 timestamp with a zone, kept
    as written.  One with a blank, a newline, a no-break space or a line separator around it is
    not: ``publish`` (and ``publish --batch``) refuses it with EINVAL naming the field, and
    nothing is pending."""
    stamp = "2026-06-22T12:00:00Z"
    for created in (" " + stamp, stamp + "\n", stamp + NBSP, stamp + "\u2028", stamp + "\t"):
        body = json.dumps({"tool": "fs.read", "input": {}, "created": created})
        r = queue.run("publish", "-", input=body)
        refused(r, 1, "EINVAL", "created")
        batch = queue.run("publish", "--batch", "-", input=body + "\n")
        refused(batch, 1, "EINVAL")
        assert queue.entries("pending") == set() and queue.entries("inbox") == set()


def test_request_field_names_and_stamps_spelt_otherwise(queue):
    """§2.1, docs/queue.md: a request has a ``tool`` string and an ``input`` object; ``Tool``,
    ``TOOL``, ``tool `` and ``Input`` are other fields, so the request lacks one (EINVAL naming
    it, nothing published).  ``created`` with fullwidth digits, a fullwidth ``ｚ``, ``+0000`` or no
    zone is no RFC 3339 stamp; the lower-case ``t`` and ``z`` RFC 3339
    allows are one, kept as written."""
    for body, field in (
        ('{"Tool":"fs.read","input":{}}', "tool"),
        ('{"TOOL":"fs.read","input":{}}', "tool"),
        ('{"tool ":"fs.read","input":{}}', "tool"),
        ('{"tool":"fs.read","Input":{}}', "input"),
    ):
        refused(queue.run("publish", "-", input=body), 1, "EINVAL", f"field '{field}'")
    for created in (
        fullwidth("2026") + "-06-22T12:00:00Z",
        "2026-06-22T12:00:00\uff5a",
        "2026-06-22T12:00:00+0000",
        "2026-06-22T12:00:00",
    ):
        body = json.dumps({"tool": "fs.read", "input": {}, "created": created})
        refused(queue.run("publish", "-", input=body), 1, "EINVAL", "field 'created'")
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()
    body = json.dumps({"tool": "fs.read", "input": {}, "created": "2026-06-22t12:00:00z"})
    job = queue.run("publish", "-", input=body).out.strip()
    stored = json.loads((queue.dir / "pending" / job).read_text())
    assert stored["created"] == "2026-06-22t12:00:00z", stored


def test_finish_result_status_spelt_otherwise_is_never_taken_for_ok_or_error(queue, child):
    """Q-4, docs/queue.md: a whole result object ``{"status": "ok"|"error", "output": …}`` gives
    its output, and its status must agree with ``--ok``/``--error`` (else EINVAL, exit 2,
    nothing moved).  ``{"status": "OK", …}`` is no such object: with ``--ok`` the whole object
    is the output, never unwrapped as if it said ``ok``."""
    job = queue.publish()
    queue.claim("--pid", str(child.pid))
    clash = queue.run("finish", job, "--error", "-", input='{"status": "ok", "output": 1}')
    refused(clash, 2, "EINVAL", "status 'ok'", "--error")
    assert queue.state(job) == "claimed"
    queue.finish(job, "--ok", output={"status": "ok", "output": {"n": 1}})
    assert queue.only_result(job)[1]["output"] == {"n": 1}
    for word in ("OK", cyrillic("ok")):
        job = queue.publish()
        queue.claim("--pid", str(child.pid))
        queue.finish(job, "--ok", output={"status": word, "output": {"n": 2}})
        state, stored = queue.only_result(job)
        assert state == "done" and stored["status"] == "ok", stored
        assert stored["output"] == {"status": word, "output": {"n": 2}}, (word, stored)


def test_result_status_spelt_otherwise_beside_a_claim_is_a_conflict(queue):
    """Q-6, docs/queue.md: a result beside a claimed request rolls forward only when it is a
    result object whose ``status`` is its directory's (``ok`` in ``done/``); ``OK`` and
    ``true`` are conflicts, reported and never resolved, the request left
    claimed; the exact word rolls forward."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    for word in ("ok", "OK", True):
        job = queue.publish()
        assert queue.claim("--pid", str(dead.pid)) == job
        result = {
            "status": word,
            "output": 1,
            "worker": {"worker": "x"},
            "started": "2026-01-01T00:00:00Z",
            "finished": "2026-01-01T00:00:01Z",
        }
        (queue.dir / "done" / f"{job}.result").write_text(json.dumps(result))
        r = queue.run("recover", "--reconcile", "--json")
        report = r.json()
        if word == "ok":
            assert r.rc == 0 and queue.state(job) == "done", report
            continue
        assert r.rc == 1 and report["repaired"] == [] and report["requeued"] == [], (word, r)
        assert any(job in json.dumps(c) for c in report["conflicts"]), (word, report)
        assert (queue.dir / "claimed" / job / job).is_file(), word
        assert not (queue.dir / "done" / job).exists(), word


def test_job_suffix_spelt_otherwise_is_part_of_the_name(queue):
    """§2.4: ``--name J`` may leave out ``.req.json``, which is then added.  ``.REQ.JSON``,
    ``.Req.Json`` and ``.req.json.`` are no such suffix: the suffix is added after them, never
    taken as the one already there; ``show`` of ``alpha.REQ.JSON`` finds no ``alpha.req.json``."""
    assert queue.publish(name="alpha") == "alpha.req.json"
    for given, stored in (
        ("beta.REQ.JSON", "beta.REQ.JSON.req.json"),
        ("gamma.Req.Json", "gamma.Req.Json.req.json"),
        ("delta.req.json.", "delta.req.json..req.json"),
    ):
        assert queue.publish(name=given) == stored
    assert queue.run("show", "alpha").rc == 0
    for name in ("alpha.REQ.JSON", "Alpha", "ALPHA.req.json"):
        refused(queue.run("show", name), 1, "ENOENT")
    refused(queue.run("show", fullwidth("a") + "lpha"), 2, "EINVAL", "illegal job name")


@needs_root
def test_shell_worker_leaves_other_spellings_of_shell_exec_pending(searchable_storage, scratch):
    """docs/workers.md: a ``--kind shell`` worker claims ``shell.exec`` jobs only; a job of
    another tool stays pending.  ``Shell.Exec`` and ``SHELL.EXEC`` (legal names of other tools)
    are not ``shell.exec``: the draining worker claims neither and they stay pending with no
    lease; a request naming ``shell.exec`` with a blank or a look-alike is refused at publish."""
    make_host(searchable_storage, scratch, ["shell.exec"])
    queue = QueueCLI(searchable_storage, "proj")
    jobs = [
        queue.publish({"tool": t, "input": {"cmd": "true"}}) for t in ("Shell.Exec", "SHELL.EXEC")
    ]
    for tool in ("shell.exec ", cyrillic("shell.exec"), "shell.exec" + ZWJ):
        body = json.dumps({"tool": tool, "input": {"cmd": "true"}})
        refused(queue.run("publish", "-", input=body), 1, "EINVAL", "field 'tool'")
    worked = queue.run("work", "--agent", "ci", "--kind", "shell", "--drain", "--json")
    assert worked.rc == 0, worked
    assert all(queue.state(job) == "pending" for job in jobs)
    assert queue.entries("lease") == set() and queue.entries("done") == set()


def claim_for(queue: QueueCLI, pid: int, **lease_changes) -> str:
    """A job published and claimed for ``pid`` (1000 s lease), its lease then rewritten with
    ``lease_changes``."""
    job = queue.publish()
    assert queue.claim("--pid", str(pid), "--ttl", "1000") == job
    lease = queue.lease(job)
    lease.update(lease_changes)
    queue.write_lease(job, lease)
    return job


def holder_of(queue: QueueCLI, job: str) -> dict:
    return queue.run("show", job, "--json").json()["holder"]


def test_misspelt_boot_id_is_never_taken_for_a_reboot(queue, child):
    """Q-5, docs/queue.md: ``boot_id`` is compared as one spelling so that a boot written
    otherwise is never taken for a reboot that would requeue the job of a live holder; a lease
    field that is malformed makes the lease unreadable, never requeued.  With the holder alive
    on this host, ``recover`` must leave each such job claimed."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    jobs = [
        claim_for(queue, child.pid, boot_id=b)
        for b in ("unknown.", "unkown", fullwidth("unknown"), boot + ".")
    ]
    report = queue.run("recover", "--json").json()
    assert report["requeued"] == [], report
    for job in jobs:
        assert queue.state(job) == "claimed", job
        assert holder_of(queue, job)["state"] != "gone", holder_of(queue, job)


def test_boot_id_spellings_of_one_boot_keep_a_live_holder(queue, child):
    """docs/queue.md: ``boot_id`` is trimmed, lower-cased and a UUID in its canonical form
    (capitals, braces, no dashes: the same boot); ``unknown`` in any case proves no reboot.
    With the holder alive, none of these is requeued."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    spellings = {
        "{" + boot.upper() + "}": "alive",
        boot.replace("-", "") + "\n": "alive",
        " UNKNOWN ": "unknown",
    }
    jobs = {claim_for(queue, child.pid, boot_id=b): state for b, state in spellings.items()}
    report = queue.run("recover", "--json").json()
    assert report["requeued"] == [], report
    for job, state in jobs.items():
        assert queue.state(job) == "claimed" and holder_of(queue, job)["state"] == state, job


def test_pid_ns_spelt_otherwise_makes_the_lease_unreadable_never_another_namespace(queue):
    """Q-3, docs/queue.md: ``pid_ns`` is the inode number or ``pid:[N]`` as ``readlink`` shows
    it.  With the holder dead, the exact forms are proof of its death (requeued); ``PID:[N]``,
    fullwidth digits or ``true`` are malformed: the lease is unreadable,
    a conflict, never requeued."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    ns = os.stat("/proc/self/ns/pid").st_ino
    gone = [claim_for(queue, dead.pid, pid_ns=v) for v in (ns, f"pid:[{ns}]")]
    kept = [claim_for(queue, dead.pid, pid_ns=v) for v in (f"PID:[{ns}]", fullwidth(str(ns)), True)]
    for job in kept:
        assert holder_of(queue, job)["state"] == "unreadable", holder_of(queue, job)
    r = queue.run("recover", "--json")
    assert r.rc == 1, r
    requeued = r.json()["requeued"]
    assert len(requeued) == 2 and all(job in json.dumps(requeued) for job in gone), r
    for job in gone:
        assert queue.state(job) == "pending", job
    for job in kept:
        assert queue.state(job) == "claimed", job


# ========================================================================== tools and outputs


@needs_root
def test_native_frames_events_and_explanations_use_the_documented_words(
    searchable_storage, scratch
):
    """``ctx run --help``, S-2, docs/sessions.md, docs/policy.md: native frames are of type
    ``call``, ``stderr`` and ``result`` (last); a result's status is ``ok`` or ``error``; the
    session records ``tool_call`` then ``tool_result`` (never S-2's example ``tool.call``), each
    event starting with the six keys ``ts, type, agent, session, object, status``; the tool
    runs with ``CTX_MODE`` exactly ``native`` or ``terminal``; ``explain --json`` gives each
    step's result as ``pass``, ``deny``, ``n/a`` or ``not reached``."""
    host = make_host(searchable_storage, scratch, ["say.x"])
    host.install("say.x", '#!/bin/sh\ncat >/dev/null\necho "mode=$CTX_MODE" >&2\necho "{}"\n')
    host.grant("say.x")
    r = host.ctx("run", "--agent", "ci", "--native", "--session", "w", "say.x", input="{}")
    frames = [json.loads(line) for line in r.lines()]
    assert [f["type"] for f in frames] == ["call", "stderr", "result"], frames
    assert frames[1]["text"] == "mode=native", frames
    assert frames[-1]["status"] == "ok" and frames[-1]["mode"] == "native", frames
    terminal = host.ctx("run", "--agent", "ci", "--session", "w", "say.x", input="{}")
    assert terminal.rc == 0 and "mode=terminal" in terminal.err, terminal
    events = host.events("w")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"] * 2, events
    for event in events:
        assert list(event)[:6] == ["ts", "type", "agent", "session", "object", "status"], event
        assert event["status"] in ("ok", "error"), event
    results = set()
    for question in (
        ("tool:say.x", "execute"),
        ("network:default", "connect"),
        ("tool:fs.write", "execute"),
    ):
        steps = host.ctx("policy", "explain", "ci", *question, "--json").json()["steps"]
        results |= {step["result"] for step in steps}
    assert results <= {"pass", "deny", "n/a", "not reached"} and {"pass", "deny"} <= results


@needs_root
def test_secret_key_words_in_other_cases_and_separators_are_redacted(searchable_storage, scratch):
    """S-4, docs/sessions.md: a key names a secret when, lower-cased and with all but letters
    and digits dropped, it holds ``password``, ``apikey``, ``token``, ``authorization``… or
    ends in the word ``auth``: ``PASSWORD``, ``Pass_Word``, ``pass-word``, ``pass.word``, a
    zero-width joiner inside, ``API-KEY``, ``Api.Key``, ``AUTHORIZATION``, ``Token``, ``X-AUTH``
    are all such keys, and their values never reach the session or the tool's log."""
    host = make_host(searchable_storage, scratch, ["say.x"])
    host.install("say.x", '#!/bin/sh\ncat >/dev/null\necho "{}"\n')
    host.grant("say.x")
    keys = [
        "PASSWORD",
        "Pass_Word",
        "pass-word",
        "pass.word",
        "pass" + ZWJ + "word",
        "API-KEY",
        "Api.Key",
        "AUTHORIZATION",
        "Token",
        "X-AUTH",
        "Secret",
    ]
    value = {key: f"hunter{n}-value" for n, key in enumerate(keys)}
    value["author"] = "plain-author"
    assert host.native("say.x", value, session="red")["status"] == "ok"
    logged = (host.storage / "tool" / "say.x.d" / "log").read_text().splitlines()[-1]
    for recorded in (host.events("red")[0]["input"], json.loads(logged)["input"]):
        for key in keys:
            assert recorded[key] == "[redacted]", (key, recorded)
        assert "hunter" not in json.dumps(recorded), recorded
        assert recorded["author"] == "plain-author", recorded


@needs_root
def test_fs_write_encoding_spelt_otherwise_writes_nothing(searchable_storage, scratch):
    """docs/tools.md: ``fs.write``'s ``encoding`` is ``utf-8`` or ``base64``, ``overwrite`` a
    boolean.  Other spellings are refused with EINVAL (exit 2) in native mode (the schema) and
    in terminal mode (the tool's own check: ``encoding must be 'utf-8' or 'base64'``), never
    read as the encoding they look like, and no file is written."""
    ws = scratch / "ws"
    ws.mkdir()
    host = make_host(
        searchable_storage, scratch, ["fs.write"], mount=[[str(ws), "/workspace", "rw"]]
    )
    os.chown(ws, host.uid, -1)
    host.grant("fs.write")
    body = {"path": "/workspace/e.txt", "content": "aGk="}
    for encoding in ("UTF-8", "utf-8 ", fullwidth("utf") + "-8"):
        native = host.native("fs.write", {**body, "encoding": encoding})
        assert native["status"] == "error" and native["error"]["errno"] == 22, (encoding, native)
    for encoding in ("Base64", "utf\u20118"):
        terminal = host.ctx(
            "run", "--agent", "ci", "fs.write", json.dumps({**body, "encoding": encoding})
        )
        assert terminal.rc == 2 and "encoding must be 'utf-8' or 'base64'" in terminal.err, terminal
    assert host.native("fs.write", {**body, "overwrite": "false"})["error"]["errno"] == 22
    assert not (ws / "e.txt").exists()
    assert host.native("fs.write", {**body, "encoding": "base64"})["status"] == "ok"
    assert (ws / "e.txt").read_bytes() == b"hi"


@needs_root
def test_agent_update_control_spelt_otherwise_changes_no_control(searchable_storage, scratch):
    """A-5: ``agent.update`` replaces ``system.md`` or ``prompt.template.md``; any other control
    is EINVAL.  ``System.md``, ``system.MD``, ``system.md `` with a blank, a fullwidth name, a
    zero-width joiner, ``system`` and ``./system.md`` are other controls: refused (exit 2) in
    native and terminal mode, both controls left as they were; the exact name is replaced."""
    host = make_host(searchable_storage, scratch, ["agent.update"])
    host.grant("agent.update")
    controls = host.storage / "agent" / "ci.d"
    before = {name: (controls / name).read_bytes() for name in ("system.md", "prompt.template.md")}
    for control in ("System.md", "system.md ", fullwidth("system") + ".md", "system.md" + ZWJ):
        native = host.native("agent.update", {"control": control, "content": "rewritten"})
        assert native["status"] == "error" and native["error"]["errno"] == 22, (control, native)
    for control in ("system.MD", "system", "./system.md"):
        body = json.dumps({"control": control, "content": "rewritten"})
        terminal = host.ctx("run", "--agent", "ci", "agent.update", body)
        assert terminal.rc == 2 and "agent.update: EINVAL: " in terminal.err, (control, terminal)
    assert {name: (controls / name).read_bytes() for name in before} == before
    done = host.native("agent.update", {"control": "system.md", "content": "rewritten"})
    assert done["status"] == "ok" and (controls / "system.md").read_text() == "rewritten", done


def test_ctx_mode_other_than_native_gives_plain_text(storage):
    """docs/tools.md: a core tool prints one JSON object with ``CTX_MODE=native``, plain text
    otherwise: ``Native``, ``NATIVE``, ``native `` and ``json`` are not ``native``."""
    program = storage / "tool" / "fs.stat"

    def stat(mode: str) -> subprocess.CompletedProcess:
        env = clean_env(CTX_MODE=mode)
        return subprocess.run([program, "/"], capture_output=True, text=True, env=env)

    native = stat("native")
    assert native.returncode == 0 and json.loads(native.stdout)["type"] == "directory", native
    for mode in ("Native", "NATIVE", "native ", "json", "1"):
        text = stat(mode)
        assert text.returncode == 0 and text.stdout.startswith("path: /\n"), (mode, text)


def test_man_topics_spelt_otherwise_are_unknown(storage):
    """D-1, ``ctx man --help``: ``agent``, ``ctx.agent`` and ``ctx.agent.md`` name one page; an
    unknown topic is ENOENT (exit 1) listing the topics.  ``Agent``, ``AGENT``, ``agent.``,
    ``agents``, a look-alike, a zero-width joiner, a number and ``root_abi`` are unknown."""
    env = clean_env(CTX_STORAGE=str(storage))
    page = ctx_run("man", "agent", env=env)
    assert page.rc == 0 and page.out, page
    assert ctx_run("man", "ctx.agent.md", env=env).out == page.out
    spellings = [*otherwise("agent").values(), "AGENT", "root_abi"]
    for topic in spellings:
        r = ctx_run("man", topic, env=env)
        refused(r, 1, "ENOENT", "the topics are README, agent, tool, model")
        assert r.out == "", (topic, r)


def test_man_readme_in_any_case_is_the_readme(storage):
    """D-1, docs/tools.md: the README's topic is ``README`` in any case, with or without
    ``.md`` (a file name, spelt as systems show it); another word is an unknown topic."""
    env = clean_env(CTX_STORAGE=str(storage))
    readme = ctx_run("man", "README", env=env)
    assert readme.rc == 0 and readme.out, readme
    for topic in ("ReadMe", "Readme", "README.MD", "readme.md"):
        r = ctx_run("man", topic, env=env)
        assert (r.rc, r.out) == (0, readme.out), (topic, r)
    refused(ctx_run("man", "READ.ME", env=env), 1, "ENOENT", "the topics are")


MCP_SERVER = r"""
import json, os, sys
VERSION = json.loads(sys.argv[1])
buffer = b""
def send(message):
    os.write(1, json.dumps(message).encode() + b"\n")
def receive():
    global buffer
    while b"\n" not in buffer:
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(0)
        buffer += chunk
    line, _, buffer = buffer.partition(b"\n")
    return json.loads(line)
while True:
    message = receive()
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        result = {"protocolVersion": VERSION, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "w", "version": "1"}}
    elif message["method"] == "tools/list":
        result = {"tools": [{"name": "echo", "description": "Echo.",
                             "inputSchema": {"type": "object"}}]}
    else:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no"}})
        continue
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})
"""


def test_mcp_protocol_version_and_server_type_spelt_otherwise(scratch):
    """M-1, M-2, docs/tools.md: ctxmcp accepts only a negotiated ``2025-11-25``, ``2025-06-18``,
    ``2025-03-26`` or ``2024-11-05``: the same date with a blank, a zero-width joiner, fullwidth
    digits, Unicode hyphens or as a number is another version, ``EPROTO``
    naming the four (exit 1); an entry whose ``type`` is not ``stdio`` (``STDIO``, ``stdio ``)
    is refused as no stdio server (EINVAL, exit 2)."""
    server = scratch / "server.py"
    server.write_text(MCP_SERVER)
    config = scratch / "mcp.json"

    def listing(version: object, kind: str | None = None) -> subprocess.CompletedProcess:
        entry = {"command": sys.executable, "args": [str(server), json.dumps(version)]}
        if kind is not None:
            entry["type"] = kind
        config.write_text(json.dumps({"mcpServers": {"w": entry}}))
        return subprocess.run(
            [CTXMCP, "list", "--config", config, "--server", "w", "--timeout", "10"],
            capture_output=True,
            text=True,
        )

    good = listing("2025-06-18", "stdio")
    assert good.returncode == 0 and good.stdout.startswith("w.echo"), good
    for version in (
        "2025-06-18 ",
        "2025-06-18" + ZWJ,
        fullwidth("2025") + "-06-18",
        "2025\u201006\u201018",
        20250618,
    ):
        r = listing(version)
        assert r.returncode == 1 and "EPROTO" in r.stderr, (version, r)
        assert "2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05" in r.stderr, (version, r)
    for kind in ("STDIO", "stdio "):
        r = listing("2025-11-25", kind)
        assert r.returncode == 2 and "EINVAL" in r.stderr and "not a stdio server" in r.stderr, r


def test_queue_outputs_use_the_documented_state_words(queue, child):
    """§2.1, §2.4, docs/queue.md: ``list`` prints ``STATE NAME`` lines with the state words
    ``pending``, ``claimed``, ``done``, ``failed``; ``status --json`` counts under exactly
    those keys plus ``conflict``, in ``counts`` with ``incomplete`` and ``ignored``; ``show
    --json`` gives the state word, and ``holder.state`` ``alive`` for a live holder."""
    jobs = {name: queue.publish(name=name) for name in ("a", "b", "c", "d")}
    for _ in range(3):
        queue.claim("--pid", str(child.pid))
    queue.finish(jobs["a"], "--ok")
    queue.finish(jobs["c"], "--error")
    listed = queue.run("list")
    words = {line.split()[1]: line.split()[0] for line in listed.lines()}
    assert words == {
        jobs["a"]: "done",
        jobs["b"]: "claimed",
        jobs["c"]: "failed",
        jobs["d"]: "pending",
    }, listed
    status = queue.run("status", "--json").json()
    assert {k: status[k] for k in ("pending", "claimed", "done", "failed", "conflict")} == {
        "pending": 1,
        "claimed": 1,
        "done": 1,
        "failed": 1,
        "conflict": 0,
    }, status
    assert set(status["counts"]) == {
        "pending",
        "claimed",
        "done",
        "failed",
        "incomplete",
        "conflict",
        "ignored",
    }, status
    shown = queue.run("show", jobs["b"], "--json").json()
    assert shown["state"] == "claimed" and shown["holder"]["state"] == "alive", shown
