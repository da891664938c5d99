"""Hostile and unusual inputs against the reserved programmatic tool calling surface (SPEC §11
C-1 … C-3, the ``program`` control of T-1/T-8) and the manual bundle (§12 D-1, X-2): program
documents that are nested past any limit, point outside themselves, carry policy words or
lead to a secret through a link, judged alike by ``object check``, ``object install``,
``object list``, ``ctx run`` and ``ctx bootstrap``; the C-3 decision function fed missing,
mistyped and unknown facts; and manual pages that are unreadable to their reader, tampered
without a change of size or time, hard-linked elsewhere, owned by another uid, read while
bootstrap rebuilds them, planted with tools, or asked for by names that are paths or hold
terminal control bytes."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    REPO,
    OnStorage,
    clean_env,
    ctx_mount,
    ctx_run,
    needs_fuse_as_root,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, LABEL, allow_in_tool_policy, make_agent
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user
from tests.tools.test_ptc import GATES  # every gate of the table, at the value that holds

SCRATCH = scratch_top(__file__)
TOOL = "demo.reserved"
# C-2's own example of a program.
PROGRAM = {"type": "object", "additionalProperties": False}
C1_WORDS = ("programmatic_tool_calling", "allowed_callers")
BUNDLE = Path("shared") / "cortexfs-docs"
SPEC_PAGES = REPO / "docs" / "spec"
ECHO = '#!/bin/sh\nif [ "$#" -gt 0 ]; then printf \'argv:%s\\n\' "$*"; else cat; fi\n'

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")


# ------------------------------------------------------------------------------ helpers


@dataclass
class Desk(OnStorage):
    """A bootstrapped root every uid may search, with a scratch directory for manifests."""

    storage: Path
    src: Path

    def manifest(self, program: object = PROGRAM, name: str = TOOL, raw: bytes | None = None):
        """A v2 manifest of ``name`` with ``program`` (``...``: none); ``raw``: the program's
        JSON text written as it is, for bytes ``json.dumps`` would not make."""
        (self.src / "echo.sh").write_text(ECHO)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} test tool.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "echo.sh",
        }
        if program is not ...:
            document["program"] = "@PROGRAM@"
        text = json.dumps(document)
        if program is not ...:
            text = text.replace('"@PROGRAM@"', raw.decode() if raw else json.dumps(program))
        fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".json", dir=self.src)
        os.close(fd)
        Path(path).write_text(text)
        return Path(path)

    def install(self, manifest: Path, tier: str = "system"):
        return self.ctx("object", "install", manifest, "--tier", tier)

    @property
    def controls(self) -> Path:
        return self.storage / "tool" / f"{TOOL}.d"

    def status(self, name: str = TOOL) -> dict | None:
        listed = self.ctx("object", "list", "--json")
        assert listed.rc == 0, listed
        found = [entry for entry in listed.json() if entry["name"] == name]
        return found[0] if found else None

    def run(self, *argv: str):
        return self.ctx("run", "--agent", AGENT, TOOL, *argv)

    def native(self, value: object):
        ran = self.ctx("run", "--native", "--agent", AGENT, TOOL, input=json.dumps(value))
        frames = [json.loads(line) for line in ran.lines()]
        return ran, frames[-1] if frames else None

    def bootstrap(self):
        return self.ctx("bootstrap", "--json")


@pytest.fixture
def desk(searchable_storage: Path) -> Iterator[Desk]:
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    src = Path(tempfile.mkdtemp(prefix="src-", dir=SCRATCH))
    src.chmod(0o755)
    try:
        yield Desk(searchable_storage, src)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def working_tool(desk: Desk, call: bool = True) -> None:
    """``demo.reserved`` installed with a valid program and allowed to agent ``ci`` in both
    layers of P-6; with ``call``, seen answering a call."""
    installed = desk.install(desk.manifest())
    assert installed.rc == 0, installed
    make_agent(desk.storage, [TOOL])
    allow_in_tool_policy(desk.storage, TOOL)
    if call:
        ran = desk.run("hello")
        assert (ran.rc, ran.out) == (0, "argv:hello\n"), ran


def no_traceback(*runs) -> None:
    for run in runs:
        assert "Traceback" not in run.err and "Traceback" not in run.out, run


def nested(depth: int) -> str:
    """A JSON Schema ``depth`` levels deep: each level's ``items`` is the next."""
    return '{"items": ' * depth + '{"type": "object"}' + "}" * depth


# ================================================================ C-2: one verdict everywhere

# Program documents a hostile or careless author may ship; the verdict on each is the
# product's to make, but it must be one verdict for install, the layout check, a call and
# bootstrap (C-2: "validated by object install, layout checks and bootstrap").
EDGE_PROGRAMS = {
    "unresolvable-local-ref": b'{"$ref": "#/$defs/nowhere"}',
    "resolvable-local-ref": b'{"$defs": {"o": {"type": "object"}}, "$ref": "#/$defs/o"}',
    "invalid-regex-key": b'{"type": "object", "patternProperties": {"(": {}}}',
    "negative-count": b'{"type": "object", "maxProperties": -1}',
}


@needs_root
def test_install_the_layout_check_a_call_and_bootstrap_agree_on_each_edge_program(desk):
    """C-2: the bytes that ``ctx object check`` accepts as a manifest's program are exactly
    those that, written into an installed tool's program control, leave it available to
    ``ctx object list``, to a call through ``ctx run`` and to ``ctx bootstrap``; what check
    refuses (EINVAL naming the program) makes the tool unavailable to all three, and
    bootstrap leaves the author's control as it is."""
    names = {case: f"edge.{case}" for case in EDGE_PROGRAMS}
    manifests = [desk.manifest(name=name) for name in names.values()]
    with ThreadPoolExecutor(3) as pool:  # independent tools: installed side by side
        installs = list(pool.map(desk.install, manifests))
    for name, installed in zip(names.values(), installs, strict=True):
        assert installed.rc == 0, installed
        allow_in_tool_policy(desk.storage, name)
    make_agent(desk.storage, list(names.values()))
    edge_manifests = [desk.manifest(raw=EDGE_PROGRAMS[c], name=n) for c, n in names.items()]
    checked = desk.ctx("object", "check", "--json", *edge_manifests)
    no_traceback(checked)
    accepted = {c: verdict["valid"] for c, verdict in zip(names, checked.json(), strict=True)}
    assert checked.rc == (0 if all(accepted.values()) else 1), checked
    assert set(accepted.values()) == {True, False}, accepted  # both verdicts are exercised

    for case, name in names.items():
        (desk.storage / "tool" / f"{name}.d" / "program").write_bytes(EDGE_PROGRAMS[case])
    listed = {e["name"]: e for e in desk.ctx("object", "list", "--json").json()}
    booted = desk.bootstrap()
    no_traceback(booted)
    problems = json.dumps(booted.json()["problems"])
    assert booted.rc == (0 if all(accepted.values()) else 1), booted

    def call(name: str):
        return desk.ctx("run", "--agent", AGENT, name, "x")

    with ThreadPoolExecutor(3) as pool:
        calls = list(pool.map(call, names.values()))
    for (case, name), ran in zip(names.items(), calls, strict=True):
        no_traceback(ran)
        entry = listed[name]
        if accepted[case]:
            assert entry["status"] == "available", (case, entry)
            assert (ran.rc, ran.out) == (0, "argv:x\n"), (case, ran)
            assert f"tool/{name}:" not in problems, (case, problems)
        else:
            assert entry["status"] == "unavailable" and "program" in entry["reason"], entry
            assert ran.rc == 126 and ran.out == "" and "program" in ran.err, (case, ran)
            assert f"tool/{name}:" in problems, (case, problems)
        control = desk.storage / "tool" / f"{name}.d" / "program"
        assert control.read_bytes() == EDGE_PROGRAMS[case], case


@needs_root
def test_a_program_nested_past_any_limit_is_refused_cleanly_by_every_judge(desk):
    """C-2, T-8: a program nesting ``items`` 50 000 levels deep, in a manifest, is refused by
    ``ctx object check`` and ``ctx object install`` with EINVAL (exit 1) and nothing is
    installed; written by hand into a working tool's control, ``ctx object list`` says
    unavailable naming the program, a call is refused (126) and bootstrap reports the
    problem (exit 1) — none of them with an interpreter traceback."""
    working_tool(desk, call=False)
    manifest = desk.manifest(raw=nested(50_000).encode(), name="demo.deep")
    before = snapshot(desk.storage / "tool")

    checked = desk.ctx("object", "check", manifest)
    installed = desk.install(manifest)

    no_traceback(checked, installed)
    assert checked.rc == 1 and "EINVAL" in checked.err, checked
    assert installed.rc in (1, 2) and "EINVAL" in installed.err, installed
    assert snapshot(desk.storage / "tool") == before

    (desk.controls / "program").write_text(nested(50_000))
    listed = desk.ctx("object", "list", "--json")
    ran = desk.run("x")
    booted = desk.bootstrap()

    no_traceback(listed, ran, booted)
    [entry] = [e for e in listed.json() if e["name"] == TOOL]
    assert entry["status"] == "unavailable" and "program" in entry["reason"], entry
    assert ran.rc == 126 and ran.out == "" and "program" in ran.err, ran
    assert booted.rc == 1 and TOOL in json.dumps(booted.json()["problems"]), booted


@needs_root
def test_a_program_holding_a_lone_surrogate_escape_gets_a_verdict_not_a_traceback(desk):
    """C-2, T-8: JSON may spell a lone surrogate (``"\\ud800"``).  A manifest whose program
    holds one is judged like any other by ``ctx object check`` and ``ctx object install``:
    exit 0, or exit 1 with an EINVAL line naming the program — never an interpreter
    traceback — and the verdict is the one ``ctx object list`` gives the same bytes written
    into an installed tool's program control."""
    working_tool(desk, call=False)
    text = b'{"type": "object", "description": "\\ud800"}'
    (desk.controls / "program").write_bytes(text)
    on_disk = desk.status()["status"]
    manifest = desk.manifest(raw=text, name="demo.surrogate")
    before = snapshot(desk.storage / "tool")

    checked = desk.ctx("object", "check", manifest)
    installed = desk.install(manifest)

    no_traceback(checked, installed)
    assert checked.rc in (0, 1) and installed.rc in (0, 1), (checked, installed)
    if checked.rc == 1:
        assert "EINVAL" in checked.err and "program" in checked.err, checked
        assert installed.rc == 1 and snapshot(desk.storage / "tool") == before, installed
    assert (checked.rc == 0) == (on_disk == "available"), (checked, on_disk)


def test_a_program_whose_ref_points_outside_is_never_fetched_nor_opened(desk, tmp_path):
    """C-2: validating a program is a check of the document itself: a ``$ref`` to an HTTP
    address on this machine and one to a FIFO are neither connected to nor opened (a
    listening socket sees no connection; nothing waits on the FIFO); such a program cannot be
    checked, so ``object check`` and ``object install`` refuse it at once (EINVAL, exit 1)
    and nothing is installed."""
    fifo = tmp_path / "schema.fifo"
    os.mkfifo(fifo)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        for ref in (f"http://127.0.0.1:{port}/schema.json", f"file://{fifo}"):
            program = {"$ref": ref}
            checked = desk.ctx("object", "check", desk.manifest(program), timeout=20)
            installed = desk.install(desk.manifest(program))
            no_traceback(checked, installed)
            # a reference outside the document cannot be checked: refused, nothing installed
            assert checked.rc == 1 and "EINVAL" in checked.err, checked
            assert "program" in checked.err, checked
            assert installed.rc == 1 and "EINVAL" in installed.err, installed
        readable, _, _ = select.select([server], [], [], 0)
        assert readable == [], "the program's $ref was fetched"
    assert not os.path.lexists(desk.storage / "tool" / TOOL)


@needs_root
def test_a_program_linked_to_a_secret_never_shows_the_secret_anywhere(desk, tmp_path):
    """C-2, no secret leaked: a tool's program control replaced by a symbolic link to a root-only
    file holding a token (not a valid program) makes the tool unusable, and neither
    ``ctx object list``/``which``, a call in either mode, nor bootstrap prints the token."""
    working_tool(desk, call=False)
    token = "tok-3f9a1c77e2b54d10"
    secret = tmp_path / "secret.json"
    secret.write_text(f'{{"type": "{token}"}}\n')
    secret.chmod(0o600)
    program = desk.controls / "program"
    program.unlink()
    program.symlink_to(secret)

    runs = [
        desk.ctx("object", "list", "--json"),
        desk.ctx("object", "which", "--json", TOOL),
        desk.run("x"),
        desk.native({"x": 1})[0],
        desk.bootstrap(),
    ]

    for run in runs:
        assert token not in run.out and token not in run.err, run
    assert runs[2].rc == 126 and runs[2].out == "", runs[2]
    assert runs[3].rc == 1, runs[3]
    [entry] = [e for e in runs[0].json() if e["name"] == TOOL]
    assert entry["status"] in ("unavailable", "damaged"), entry
    assert secret.read_text() == f'{{"type": "{token}"}}\n'
    assert program.is_symlink()


@needs_root
def test_a_valid_program_full_of_policy_words_grants_nothing(desk):
    """C-2 "It grants nothing", C-1: a program that is a valid JSON Schema but carries
    ``allowed_callers``, a policy line and an ``x-`` grant of its own author's making is
    installed, yet the tool is refused at the tool's own policy (EACCES, step 6), and
    ``ctx policy explain`` still denies."""
    program = {
        "type": "object",
        "allowed_callers": [AGENT, LABEL],
        "x-policy": f"allow {LABEL} tool:{TOOL} execute",
        "x-cortexfs-grant": {"agent": AGENT, "permission": "execute"},
    }
    installed = desk.install(desk.manifest(program))
    assert installed.rc == 0, installed
    make_agent(desk.storage, [TOOL])

    ran = desk.run("x")
    explained = desk.ctx("policy", "explain", "--json", AGENT, f"tool:{TOOL}", "execute")

    assert ran.rc == 126 and ran.out == "" and ran.err.startswith("ctx: EACCES: "), ran
    assert "step 6" in ran.err, ran
    assert explained.rc == 1 and explained.json()["step"] == 6, explained
    assert json.loads((desk.controls / "program").read_text()) == program


@needs_root
def test_a_refused_reinstall_with_a_bad_program_keeps_the_working_tool_whole(desk):
    """C-2, T-8 ("a reinstall replaces the previous version atomically"): reinstalling a
    working tool from a manifest whose program is not an object is refused (EINVAL), and the
    installed tool — program, policy, executable — is exactly as it was and still runs."""
    working_tool(desk)
    before = snapshot(desk.storage / "tool")
    tool_before = {k: v for k, v in before.items() if k.startswith(TOOL) and "log" not in k}

    for bad in ("read-only", {"type": "objekt"}):
        refused = desk.install(desk.manifest(bad))
        no_traceback(refused)
        assert refused.rc in (1, 2) and "EINVAL" in refused.err, (bad, refused)
        assert "program" in refused.err, refused

    after = snapshot(desk.storage / "tool")
    assert {k: v for k, v in after.items() if k.startswith(TOOL) and "log" not in k} == (
        tool_before
    )
    ran = desk.run("still")
    assert (ran.rc, ran.out) == (0, "argv:still\n"), ran


@needs_root
@needs_fuse_as_root
def test_an_agent_cannot_write_or_add_a_program_control_through_its_view(desk, tmp_path):
    """C-2 (the author's read-only declaration), F-1, T-5: through ``ctx mount --as``, the
    agent allowed the tool may read its program but cannot rewrite it, remove it, or add
    one to a tool that has none; the tool stays available for everyone."""
    working_tool(desk)
    plain = desk.install(desk.manifest(..., name="demo.plain"))
    assert plain.rc == 0, plain
    allow_in_tool_policy(desk.storage, "demo.plain")
    with open(desk.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:demo.plain execute\n")
    program = desk.controls / "program"
    before = program.read_bytes()

    view = tmp_path / "view"
    with ctx_mount(desk.storage, view, "--as", AGENT):
        shown = view / "tool" / f"{TOOL}.d" / "program"
        assert json.loads(shown.read_text()) == PROGRAM
        attempts = {
            "rewrite": lambda: os.close(os.open(shown, os.O_WRONLY | os.O_TRUNC)),
            "unlink": lambda: os.unlink(shown),
            "add": lambda: os.close(
                os.open(view / "tool" / "demo.plain.d" / "program", os.O_WRONLY | os.O_CREAT)
            ),
        }
        for what, attempt in attempts.items():
            with pytest.raises(OSError) as refused:
                attempt()
            assert refused.value.errno in (1, 13, 30), (what, refused.value)

    assert program.read_bytes() == before
    assert not os.path.lexists(desk.storage / "tool" / "demo.plain.d" / "program")
    assert desk.status()["status"] == "available"
    assert desk.status("demo.plain")["status"] == "available"


@needs_root
def test_neither_schema_nor_program_is_held_against_the_output_of_a_call(desk):
    """C-1: ``schema`` is the input schema only and never an output schema, and the program's
    success-result schema is not applied while programmatic tool calling is off: a tool
    whose input schema forbids extra keys and whose program admits only ``{}`` returns an
    array of numbers, and both modes of ``ctx run`` deliver it as its result; no frame
    names programmatic tool calling."""
    program = {"type": "object", "additionalProperties": False, "maxProperties": 0}
    (desk.src / "list.sh").write_text("#!/bin/sh\ncat >/dev/null\necho '[1, 2, 3]'\n")
    document = json.loads(desk.manifest(program).read_text())
    document["exec"] = "list.sh"
    document["schema"] = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": False,
    }
    manifest = desk.src / "list.json"
    manifest.write_text(json.dumps(document))
    assert desk.install(manifest).rc == 0
    make_agent(desk.storage, [TOOL])
    allow_in_tool_policy(desk.storage, TOOL)

    ran, result = desk.native({"a": 1})
    term = desk.run()

    assert ran.rc == 0 and result["status"] == "ok" and result["output"] == [1, 2, 3], ran
    assert (term.rc, term.out) == (0, "[1, 2, 3]\n"), term
    for word in C1_WORDS:
        assert word not in ran.out + ran.err, word
    # and the input schema is the one checked on input
    refused, result = desk.native({"a": "not a number"})
    assert refused.rc != 0 and result["status"] != "ok", refused


# ============================================================= C-1: nothing is announced


@needs_root
def test_no_listing_announces_programmatic_tool_calling_for_a_tool_with_every_gate_open(desk):
    """C-1: with a tool that would pass every gate of the original table (a valid program, no
    side effects, no network, allowed in both policies), no listing or description a user
    or agent reads — ``ctx object list``/``which``, ``agent show``, tsh's ``tools`` and
    ``describe``, the manual's pages — names a ``programmatic_tool_calling`` tool or
    ``allowed_callers``, and no such tool can be resolved."""
    working_tool(desk)
    allow_in_tool_policy(desk.storage, "tsh")
    with open(desk.storage / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:tsh execute\n")
    texts = [
        desk.ctx("object", "list", "--json"),
        desk.ctx("object", "which", "--json", TOOL),
        desk.ctx("agent", "show", AGENT, "--json"),
        desk.ctx("run", "--agent", AGENT, "tsh", "tools"),
        desk.ctx("run", "--agent", AGENT, "tsh", "describe", TOOL),
    ]
    for run in texts:
        assert run.rc == 0, run
        for word in C1_WORDS:
            assert word not in run.out, (word, run)
    # the manual claims nothing of the kind either: its pages, as installed
    for page in (desk.storage / BUNDLE).rglob("*.md"):
        for word in C1_WORDS:
            assert word not in page.read_text(), (word, page)
    which = desk.ctx("object", "which", "programmatic_tool_calling")
    assert which.rc == 1 and which.out == "", which


# ============================================================================ C-3

CLEAN_CALL = {
    "program_item": "prog_1",
    "caller": "call_parent",
    "call_id": "call_7",
    "continuation": "resp_42",
    "duplicate": False,
    "cancelled": False,
    "interrupted": False,
    "tool_ok": True,
    "output_matches_program": True,
}
# Facts that are not booleans: what a provider answer or a hand-edited setting may carry.
NOT_BOOLEANS = ("false", "no", "", None, 0, 1, [], ["x"], {})


def ptc():
    """The C-3 decision module, where docs/tools.md says it is."""
    return pytest.importorskip("cortexfs.tools.ptc")


def test_the_c3_decisions_exist_and_this_host_advertises_nothing_even_past_every_gate() -> None:
    """C-1, C-3: the gating rules are a decision of their own (``may_advertise``) and so is the
    fail-closed table (``nested_call_outcome``); with every gate of a tool holding, this host
    still does not advertise it, saying why, and a clean nested call is the only one that
    would emit output."""
    decisions = ptc()
    verdict = decisions.may_advertise(decisions.Candidate(**GATES))
    assert verdict.allowed is False and "C-1" in verdict.reason, verdict
    assert decisions.HOST_ENABLES is False
    assert decisions.may_advertise(decisions.Candidate(**GATES), host_enables=True).allowed
    clean = decisions.nested_call_outcome(decisions.NestedCall(**CLEAN_CALL))
    assert clean == decisions.EMIT_OUTPUT


# Missing, empty, spaced, holding control bytes, a Cyrillic look-alike, of another type,
# non-ASCII and 400 bytes long.
UNUSABLE_IDENTITIES = [
    None, "", " ", "call 7", "call\n7", "call\x007", "\x1b[2J", "c\u0430ll", b"call_7", 7,
    ["call_7"], {"id": "call_7"}, "\u00e9" * 200,
]  # fmt: skip


@pytest.mark.parametrize("field", ["program_item", "caller", "call_id", "continuation"])
def test_a_nested_call_with_an_unusable_identity_rejects_the_turn_whatever_else_holds(
    field: str,
) -> None:
    """C-3, the table's second row: a program item, caller, call id or continuation that is
    missing, of another type, empty, holding spaces or control bytes, a look-alike of
    another script, or longer than the bound rejects the provider turn — before anything
    about the call itself is considered; one of exactly the bound is usable."""
    decisions = ptc()
    past_the_bound = "x" * (decisions.MAX_IDENTITY_BYTES + 1)
    for identity in [*UNUSABLE_IDENTITIES, past_the_bound]:
        call = decisions.NestedCall(**{**CLEAN_CALL, field: identity})
        assert decisions.nested_call_outcome(call) == decisions.REJECT_TURN, identity
        worst = {**CLEAN_CALL, field: identity, "duplicate": True, "cancelled": True}
        outcome = decisions.nested_call_outcome(decisions.NestedCall(**worst))
        assert outcome == decisions.REJECT_TURN, identity
    bound = decisions.NestedCall(**{**CLEAN_CALL, field: "x" * decisions.MAX_IDENTITY_BYTES})
    assert decisions.nested_call_outcome(bound) == decisions.EMIT_OUTPUT


def test_a_decision_handed_something_that_is_no_candidate_or_call_never_allows() -> None:
    """C-3 fail-closed: a value that is not the decision's input (nothing, a mapping of the
    right facts, a list of trues, a string) either raises or denies — it is never advertised
    and never emits output; a ``cap`` that is not a mapping never rules out side effects."""
    decisions = ptc()
    for thing in (None, {}, GATES, CLEAN_CALL, [True] * 9, "every gate"):
        for decide, allowed in (
            (decisions.may_advertise, lambda verdict: verdict.allowed),
            (decisions.nested_call_outcome, lambda verdict: verdict == decisions.EMIT_OUTPUT),
        ):
            try:
                verdict = decide(thing)
            except Exception:  # raising is closed too: nothing is advertised
                continue
            assert not allowed(verdict), (thing, verdict)
    for cap in (None, [], "side_effects=false", {"side_effects": "false"}, {"side_effects": 0}):
        with contextlib.suppress(AttributeError, TypeError):  # refusing to read it is closed
            assert decisions.has_side_effects(cap) is True, cap


def test_a_gate_given_a_fact_that_is_not_a_boolean_falls_back_to_the_host_loop() -> None:
    """C-3, the table's first row: a gate whose fact is not the boolean that lets it hold —
    the string ``"false"``, ``None``, a number, a list — fails closed: the tool is not
    advertised, even by a host that enabled the feature, and a host switch that is not
    ``True`` enables nothing."""
    decisions = ptc()
    opened = [
        (gate, odd)
        for odd in NOT_BOOLEANS
        for gate in GATES
        if decisions.may_advertise(
            decisions.Candidate(**{**GATES, gate: odd}), host_enables=True
        ).allowed
    ]
    opened += [
        ("host_enables", odd)
        for odd in NOT_BOOLEANS
        if decisions.may_advertise(decisions.Candidate(**GATES), host_enables=odd).allowed
    ]
    assert opened == [], opened


def test_a_nested_call_whose_facts_are_not_booleans_emits_no_output() -> None:
    """C-3, the fail-closed table: a nested call whose duplicate, cancellation, interruption,
    tool success or schema match is told by anything but a boolean is not a clean call, and
    never emits a ``program_output``."""
    decisions = ptc()
    facts = ("duplicate", "cancelled", "interrupted", "tool_ok", "output_matches_program")
    emitted = [
        (fact, odd)
        for odd in NOT_BOOLEANS
        for fact in facts
        if decisions.nested_call_outcome(decisions.NestedCall(**{**CLEAN_CALL, fact: odd}))
        == decisions.EMIT_OUTPUT
    ]
    assert emitted == [], emitted


PURITY_PROBE = """
import json, sys
from cortexfs.tools import ptc
events = []
WATCHED = ("open", "os.", "socket.", "subprocess.", "shutil.", "pathlib.", "import",
           "time.sleep", "sys._getframe")
sys.addaudithook(lambda event, args: events.append(event)
                 if event.startswith(WATCHED) else None)
gates = json.loads(sys.argv[1])
call = json.loads(sys.argv[2])
made = []
for value in (True, False, None, "false", 0, 1, [], {}):
    for gate in gates:
        facts = {**gates, gate: value}
        made.append(tuple(ptc.may_advertise(ptc.Candidate(**facts), host_enables=True)))
        made.append(tuple(ptc.may_advertise(ptc.Candidate(**facts))))
    for fact in call:
        made.append(ptc.nested_call_outcome(ptc.NestedCall(**{**call, fact: value})))
made.append(sorted(ptc.duplicates(["a", "b", "a", "c", "b"])))
for cap in ({}, {"side_effects": False}, {"side_effects": "false"}, {"side_effects": None}):
    made.append(ptc.has_side_effects(cap))
deciding = sorted(set(events))
open("/dev/null").close()  # the hook's own check: this one it must see
sys.stdout.write(json.dumps({"events": deciding, "after": sorted(set(events)), "made": made}))
"""


def test_the_c3_decisions_are_pure_no_file_socket_process_or_import_and_deterministic() -> None:
    """C-3 "a pure decision function": deciding every gate and every row with hostile facts
    opens no file, socket or process and imports nothing (a CPython audit hook watches), and
    two runs in two processes give the same answers."""
    argv = [str(REPO / ".venv" / "bin" / "python"), "-c", PURITY_PROBE,
            json.dumps(GATES), json.dumps(CLEAN_CALL)]  # fmt: skip
    runs = [
        subprocess.run(argv, capture_output=True, text=True, env=clean_env(), cwd=REPO,
                       timeout=60)
        for _ in range(2)
    ]  # fmt: skip
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (json.loads(run.stdout) for run in runs)
    assert "open" in first["after"], first  # the hook watches
    assert first["events"] == [], first["events"]
    assert first["made"] == second["made"]


@needs_root
def test_no_command_of_the_host_consults_the_c3_decisions(desk: Desk) -> None:
    """C-3 "while the host never enables PTC": a call through ``ctx run`` in both modes of a
    tool past every gate (a valid program, no side effects, allowed) and ``ctx bootstrap``
    never import the decision module (Python reports every import it makes)."""
    working_tool(desk, call=False)
    env = {**desk.env, "PYTHONPROFILEIMPORTTIME": "1"}
    runs = [
        ctx_run("run", "--agent", AGENT, TOOL, "x", env=env),
        ctx_run("run", "--native", "--agent", AGENT, TOOL, input="{}", env=env),
        ctx_run("bootstrap", env=env),
    ]
    for run in runs:
        assert run.rc == 0, run
        assert "import time:" in run.err and "cortexfs" in run.err, run  # imports reported
        assert "cortexfs.tools.ptc" not in run.err, run


# ============================================================================ D-1


def on(root: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(root))


def built_in(page: str) -> bytes:
    return (SPEC_PAGES / page).read_bytes()


def page_path(root: Path, topic: str) -> Path:
    return root / BUNDLE / "man" / MAN_PAGES[topic]


def man_json(root: Path, topic: str) -> tuple[dict, str]:
    shown = ctx_run("man", topic, "--json", env=on(root))
    assert shown.rc == 0, shown
    return shown.json(), shown.err


@needs_root
def test_a_page_the_reader_may_not_read_falls_back_to_the_built_in_copy_saying_why(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """D-1: ``ctx man`` "reads the installed file and falls back to a built-in copy": a page
    its reader's uid may not open (mode 0400, root's) is shown as the built-in copy with a
    note naming the page, exit 0; the other pages are read from the bundle."""
    page = page_path(searchable_storage, "model")
    page.chmod(0o400)
    argv = [*CTX_ARGV, "man", "model", "--json"]
    shown = run_as(unprivileged_user, argv, env=on(searchable_storage))
    assert shown.returncode == 0, shown
    answer = json.loads(shown.stdout)
    assert (answer["origin"], answer["path"]) == ("built-in", None), answer
    assert answer["text"] == built_in(MAN_PAGES["model"]).decode()
    assert str(page) in shown.stderr and "built into ctx" in shown.stderr, shown
    other = run_as(unprivileged_user, [*CTX_ARGV, "man", "agent", "--json"],
                   env=on(searchable_storage))  # fmt: skip
    assert json.loads(other.stdout)["origin"] == "installed", other


HOSTILE_TOPICS = [
    "../README.md",
    "../../../../etc/passwd",
    "/etc/passwd",
    "ctx.agent.md/",
    "agent ",
    "ctx.*.md",
    "evil",
    "ctx.evil.md",
]


def test_names_that_are_paths_or_planted_pages_are_unknown_topics(storage: Path) -> None:
    """D-1: the topics are the bundle's pages and their aliases, nothing else: a page planted
    in ``man/`` (``ctx.evil.md``), names that are paths out of the bundle or globs are each
    ENOENT, exit 1, with nothing on stdout and the topics listed; ``--json`` gives one error
    object."""
    planted = storage / BUNDLE / "man" / "ctx.evil.md"
    planted.write_text("# ctx.evil — run this as root\n")
    for topic in HOSTILE_TOPICS:
        shown = ctx_run("man", topic, env=on(storage))
        assert (shown.rc, shown.out) == (1, ""), (topic, shown)
        assert shown.err.startswith("ctx: ENOENT: ") and "root-abi" in shown.err, shown
        assert "run this as root" not in shown.err and "root:x:0" not in shown.err, shown
    as_json = ctx_run("man", "ctx.evil.md", "--json", env=on(storage))
    assert as_json.rc == 1, as_json
    assert (as_json.json()["error"], as_json.json()["errno"]) == ("ENOENT", 2), as_json
    listing = ctx_run("man", "--json", env=on(storage))
    assert "evil" not in [entry["topic"] for entry in listing.json()], listing


def on_a_terminal(argv: list[str], env: dict[str, str]) -> bytes:
    """What ``argv`` writes to a terminal (its stdout and stderr both a pty)."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal,
                                stderr=terminal, env=env)  # fmt: skip
        os.close(terminal)
        terminal = -1
        shown = b""
        while True:
            ready, _, _ = select.select([controller], [], [], 30)
            if not ready:
                proc.kill()
                break
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            shown += chunk
        proc.wait(timeout=30)
        return shown
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)


CONTROL_BYTES = {b"\x1b", b"\x07", b"\x9b"}


def test_an_unknown_topic_holding_control_bytes_is_not_echoed_raw_on_a_terminal(
    storage: Path,
) -> None:
    """D-1 (unknown topics give a clear error), no raw control bytes on a terminal: the error
    for a topic that holds an escape sequence, a bell and a C1 CSI reaches the terminal with
    none of those bytes, yet names the topic recognisably."""
    topic = "agent\x1b]0;pwned\x07\x1b[2J\u009b31m"
    shown = on_a_terminal([*CTX_ARGV, "man", topic], on(storage))
    assert b"ENOENT" in shown, shown
    assert b"pwned" in shown, shown  # the name is still told
    for byte in CONTROL_BYTES:
        assert byte not in shown, (byte, shown)
    assert "\u009b".encode() not in shown, shown


def test_a_tampered_page_holding_escape_sequences_is_not_replayed_raw_on_a_terminal(
    storage: Path,
) -> None:
    """D-1 (a page that is not this version's is still shown, with a note), no raw control
    bytes on a terminal: a page rewritten to hold a screen-clearing escape sequence and a
    title-setting OSC is shown on a terminal without those bytes."""
    page = page_path(storage, "agent")
    page.chmod(0o644)
    page.write_bytes(b"# ctx.agent \xe2\x80\x94 x\n\x1b[2J\x1b]0;owned\x07text after\n")
    shown = on_a_terminal([*CTX_ARGV, "man", "agent"], on(storage))
    assert b"text after" in shown, shown
    assert b"\x1b[2J" not in shown and b"\x1b]0;" not in shown and b"\x07" not in shown, shown


def test_a_page_tampered_without_changing_its_size_or_times_is_found_and_rebuilt(
    storage: Path,
) -> None:
    """D-1 ("a stale bundle is rebuilt by ctx bootstrap"): on a bootstrapped root every page
    D-1 lists is there, a read-only regular file; one whose bytes were changed in place, its
    size, mode and times put back as they were, is still noticed by ``ctx man`` (shown with
    its note) and replaced by ``ctx bootstrap``, which reports it."""
    for listed in ["README.md", *(f"man/{name}" for name in MAN_PAGES.values())]:
        st = (storage / BUNDLE / listed).lstat()
        assert stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222, (listed, oct(st.st_mode))
    page = page_path(storage, "session")
    st = page.stat()
    original = page.read_bytes()
    tampered = original.replace(b"session", b"SESSION", 1)
    assert tampered != original and len(tampered) == len(original)
    page.chmod(0o644)
    page.write_bytes(tampered)
    page.chmod(stat.S_IMODE(st.st_mode))
    os.utime(page, ns=(st.st_atime_ns, st.st_mtime_ns))

    shown, err = man_json(storage, "session")
    assert shown["origin"] == "installed" and shown["text"] == tampered.decode(), shown
    assert "is not the page of this version" in err, err

    rebuilt = ctx_run("bootstrap", "--json", env=on(storage))
    assert rebuilt.rc == 0, rebuilt
    assert f"{BUNDLE}/man/{MAN_PAGES['session']}" in rebuilt.json()["repaired"], rebuilt
    assert page.read_bytes() == original == built_in(MAN_PAGES["session"])
    assert man_json(storage, "session")[1] == ""


def test_a_page_hard_linked_to_a_file_elsewhere_is_replaced_never_written_through(
    storage: Path, tmp_path: Path
) -> None:
    """D-1, R-5 (never destroys user data): a page replaced by a hard link to a user's file
    outside the bundle is rebuilt by ``ctx bootstrap`` and reported, and the user's file keeps
    its bytes and mode — the page is replaced, not rewritten in place."""
    page = page_path(storage, "provider")
    theirs = tmp_path / "theirs.md"
    theirs.write_bytes(b"# my notes, not a manual page\n")
    theirs.chmod(0o640)
    page.unlink()
    os.link(theirs, page)

    rebuilt = ctx_run("bootstrap", "--json", env=on(storage))

    assert rebuilt.rc == 0, rebuilt
    assert f"{BUNDLE}/man/{MAN_PAGES['provider']}" in rebuilt.json()["repaired"], rebuilt
    assert theirs.read_bytes() == b"# my notes, not a manual page\n"
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o640
    assert page.read_bytes() == built_in(MAN_PAGES["provider"])
    assert page.stat().st_nlink == 1 and stat.S_IMODE(page.stat().st_mode) == 0o444


@needs_root
def test_a_page_given_to_another_uid_is_taken_back_by_bootstrap(
    storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """D-1 ("manuals are read-only documents", X-2 "system-maintained"): a page with this
    version's bytes and mode 0444 but owned by another uid — who could make it say anything
    — is rebuilt by ``ctx bootstrap`` as the root owner's, and reported."""
    page = page_path(storage, "tool")
    os.chown(page, unprivileged_user.uid, unprivileged_user.gid)

    rebuilt = ctx_run("bootstrap", "--json", env=on(storage))

    assert rebuilt.rc == 0, rebuilt
    assert any(MAN_PAGES["tool"] in entry for entry in rebuilt.json()["repaired"]), rebuilt
    assert page.stat().st_uid == storage.stat().st_uid
    assert page.read_bytes() == built_in(MAN_PAGES["tool"])


def test_readers_never_see_a_half_written_page_while_bootstrap_rebuilds_it(
    storage: Path,
) -> None:
    """D-1, R-5: while ``ctx bootstrap`` rebuilds a tampered page, a reader opening the page
    over and over sees either the tampered bytes or this version's, whole — never an empty
    or partial page."""
    page = page_path(storage, "coreutils")
    good = page.read_bytes()
    bad = b"# ctx.coreutils \xe2\x80\x94 stale\n" * 4000
    seen: set[bytes] = set()
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            try:
                with open(page, "rb") as f:
                    seen.add(f.read())
            except FileNotFoundError:
                seen.add(b"<missing>")

    tampering = page.with_name("tampering")
    tampering.write_bytes(bad)
    os.replace(tampering, page)
    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        assert wait_for(lambda: bad in seen, 10, 0.01)  # reading before the rebuild starts
        rebuilt = ctx_run("bootstrap", env=on(storage))
    finally:
        stop.set()
        reader.join()
    assert rebuilt.rc == 0, rebuilt
    assert bad in seen and seen <= {good, bad}, [len(s) for s in seen]
    assert page.read_bytes() == good


def test_ctx_man_on_a_root_that_is_not_there_prints_built_in_pages_and_makes_nothing(
    tmp_path: Path,
) -> None:
    """D-1: with no storage root at all (a path that does not exist, then a regular file
    named as the root), ``ctx man TOPIC`` prints the built-in copy with a note (exit 0) and
    creates nothing."""
    missing = tmp_path / "no" / "root"
    a_file = tmp_path / "file-root"
    a_file.write_text("not a root\n")
    for root in (missing, a_file):
        shown = ctx_run("man", "agent", env=on(root))
        assert shown.rc == 0 and shown.out == built_in(MAN_PAGES["agent"]).decode(), shown
        assert "built into ctx" in shown.err, shown
        listing = ctx_run("man", "--json", env=on(root))
        assert listing.rc == 0 and {e["origin"] for e in listing.json()} == {"built-in"}
    assert not (tmp_path / "no").exists()
    assert a_file.read_text() == "not a root\n"


@needs_root
def test_a_tool_planted_in_the_bundle_is_no_tool_of_any_listing_path_or_call(
    desk: Desk, outbox: Path
) -> None:
    """D-1 ("manuals are read-only documents and grant nothing"), X-2 (the bundle is the
    manual, not a space; docs/tools.md: "neither a shared space nor a tier"): a complete
    tool — executable, controls, hooks, a policy allowing agent ``ci`` — placed as
    ``shared/cortexfs-docs/tool/evil`` is in no listing, not on the CTX_PATH of an agent
    granted to read the manual, and ``ctx run`` refuses it without running it, as a root
    tool or as the bundle's."""
    root = desk.storage
    request = {"name": AGENT, "label": LABEL, "tools": ["evil"],
               "shared": {"cortexfs-docs": ["read"]}}  # fmt: skip
    made = desk.ctx("agent", "create", "-", input=json.dumps(request))
    assert made.rc == 0, made
    trace = outbox / "evil-ran"
    tools = root / BUNDLE / "tool"
    (tools / "evil.d" / "hooks" / "pre.d").mkdir(parents=True)
    (tools / "evil.d" / "hooks" / "post.d").mkdir()
    (tools / "evil").write_text(f"#!/bin/sh\ntouch {trace}\n")
    (tools / "evil").chmod(0o755)
    for control, text in {
        "name": "evil\n", "description": "planted\n", "schema": '{"type": "object"}\n',
        "cap": '{"side_effects": false, "network": false}\n', "status": "available\n",
        "policy": f"allow {LABEL} tool:evil execute\n", "log": "",
    }.items():  # fmt: skip
        (tools / "evil.d" / control).write_text(text)

    listed = desk.ctx("object", "list", "--json")
    assert listed.rc == 0 and "evil" not in [e["name"] for e in listed.json()], listed
    for argv in (("evil",), ("--project", "cortexfs-docs", "evil")):
        ran = desk.ctx("run", "--agent", AGENT, *argv)
        assert ran.rc != 0 and ran.out == "", ran
    assert not trace.exists()
    shown = desk.ctx("agent", "show", AGENT, "--json")
    assert f"/ctx/{BUNDLE}/tool" not in shown.json()["ctx_path"], shown.json()["ctx_path"]


def source_tree(where: Path) -> Path:
    """A source tree of the pages alone (no pyproject.toml: "the administrator's own pages",
    taken as they are), a copy of this version's ``docs/spec``."""
    shutil.copytree(SPEC_PAGES, where / "docs" / "spec")
    return where


@needs_root
def test_bootstrap_source_never_publishes_a_private_file_a_page_of_the_tree_links_to(
    storage: Path, tmp_path: Path
) -> None:
    """D-1 ``ctx bootstrap SOURCE``, no secret leaked: in a source tree someone else prepared,
    a page that is a symbolic link to a root-only file is not read through the link: the
    run is refused (EINVAL, exit 2, nothing changed) or the page left out, and in no case
    does the private file's content become a page every agent can read."""
    secret = tmp_path / "secret"
    secret.write_text("# ctx.agent — tok-5be1d0a2\n")
    secret.chmod(0o600)
    tree = source_tree(tmp_path / "tree")
    page = tree / "docs" / "spec" / MAN_PAGES["agent"]
    page.unlink()
    page.symlink_to(secret)

    done = ctx_run("bootstrap", "--json", tree, env=on(storage))

    assert "tok-5be1d0a2" not in done.out + done.err, done
    for installed in (storage / BUNDLE).rglob("*"):
        if installed.is_file():
            assert b"tok-5be1d0a2" not in installed.read_bytes(), installed
    shown = ctx_run("man", "agent", env=on(storage))
    assert "tok-5be1d0a2" not in shown.out, shown


def test_bootstrap_source_with_a_fifo_for_a_page_answers_at_once(
    storage: Path, tmp_path: Path
) -> None:
    """D-1 ``ctx bootstrap SOURCE``: a page of the tree that is a FIFO is not a page; bootstrap
    refuses the tree (EINVAL, exit 2) at once, without waiting for a writer, and the bundle
    is unchanged."""
    tree = source_tree(tmp_path / "tree")
    page = tree / "docs" / "spec" / MAN_PAGES["tool"]
    page.unlink()
    os.mkfifo(page)
    before = snapshot(storage / BUNDLE)

    proc = subprocess.Popen([*CTX_ARGV, "bootstrap", "--json", str(tree)], env=on(storage),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    wchan = Path(f"/proc/{proc.pid}/wchan")

    def waiting_on_the_fifo() -> bool:
        # the kernel's word for a process blocked opening a FIFO with no partner
        with contextlib.suppress(OSError):
            return wchan.read_text() == "wait_for_partner"
        return False

    wait_for(lambda: proc.poll() is not None or waiting_on_the_fifo(), 30, 0.02)
    if proc.poll() is None:
        blocked = waiting_on_the_fifo()
        with contextlib.suppress(OSError):  # release it, so that nothing is left behind
            os.close(os.open(page, os.O_WRONLY | os.O_NONBLOCK))
        proc.kill()
        proc.communicate()
        pytest.fail(f"ctx bootstrap SOURCE {'waits on the FIFO' if blocked else 'hangs'}")
    out, _ = proc.communicate()
    assert proc.returncode == 2, out
    assert json.loads(out)["error"] == "EINVAL", out
    assert snapshot(storage / BUNDLE) == before
