"""Acceptance tests of the letter of §4 (sessions and events), §5 (policy v0) and §6 (tools as
files) that the other acceptance files leave out, run against the installed ``ctx``: every
class with exactly its permissions, every form P-2 forbids, object names in rules, the
``CTX_PATH`` rules of T-4 as ``ctx object which`` applies them, the control directory taken
from the directory of the executable, ``ctx object list --tier``, manifest faults of T-8 not
checked elsewhere, what ``ctx agent create`` writes, and the torn-line rules of S-5 as
``ctx session show|tail|repair|list`` apply them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, ROOT_ENTRIES, Run, clean_env, ctx_run, tool_manifest
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

CLASSES = {
    "tool": ("fs.read", {"execute"}),
    "model": ("openai/gpt-5.6", {"use"}),
    "shared": ("project-a", {"read", "write"}),
    "session": ("design-review", {"read", "write", "resume"}),
    "mount": ("workspace", {"read", "write"}),
    "agent": ("review-1", {"create", "start", "stop", "read", "write"}),
    "network": ("default", {"connect"}),
}
EVERY_PERMISSION = sorted(set().union(*(perms for _, perms in CLASSES.values())))
ERROR_LINE = re.compile(r"^(?P<file>.+):(?P<line>\d+): EINVAL: (?P<reason>\S.*)$")

PROGRAM = '#!/bin/sh\necho "ran $CTX_TOOL" >> ran\ncat\n'


def error_lines(r: Run, path: Path) -> dict[int, str]:
    """The ``FILE:LINE: EINVAL: <reason>`` lines of ``ctx policy check`` (P-8), by line."""
    found = {}
    for line in r.err.splitlines():
        match = ERROR_LINE.match(line)
        assert match and match["file"] == str(path), (line, r)
        found[int(match["line"])] = match["reason"]
    return found


# ------------------------------------------------------------------ P-1 … P-3, P-8: the language


def test_p3_every_class_takes_exactly_its_permissions(tmp_path):
    """P-3: "Fixed classes and permissions; anything else is EINVAL": each class with each of
    its own permissions is a rule, each class with any permission of the table that is not
    its own is EINVAL, one line per error."""
    lines, bad = [], set()
    for cls, (name, perms) in CLASSES.items():
        for perm in EVERY_PERMISSION:
            lines.append(f"allow x_t {cls}:{name} {perm}")
            if perm not in perms:
                bad.add(len(lines))
    policy = tmp_path / "matrix"
    policy.write_text("\n".join(lines) + "\n")
    r = ctx_run("policy", "check", policy)
    assert r.rc == 1 and r.out == "", r
    assert set(error_lines(r, policy)) == bad, r


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_p8_query_allows_each_class_with_its_own_rule(tmp_path, cls):
    """P-3, P-8: a rule of each class is granted by ``ctx policy query`` when present, and
    only for the permission it names (the model's name holding its ``/`` included)."""
    name, perms = CLASSES[cls]
    perm = sorted(perms)[0]
    policy = tmp_path / "policy"
    policy.write_text(f"allow x_t {cls}:{name} {perm}\n")
    r = ctx_run("policy", "query", "--policy", policy, "x_t", f"{cls}:{name}", perm)
    assert (r.rc, r.out) == (0, "allow\n"), r
    for other in sorted(perms - {perm}):
        r = ctx_run("policy", "query", "--policy", policy, "x_t", f"{cls}:{name}", other)
        assert (r.rc, r.out) == (1, "deny\n"), r


FORBIDDEN = [
    "allow coder_t tool:fs.read execute 10",  # a priority (P-2)
    "allow coder_t tool:fs.read execute # why",  # more than four words
    "allow coder_t tool:fs.? execute",  # glob
    "allow coder_t tool:fs.[ab] execute",  # glob
    "allow *_t tool:fs.read execute",  # glob in the subject
    "allow $LABEL tool:fs.read execute",  # variable
    "allow coder_t tool:${NAME} execute",  # variable
    "allow coder_t tool:/ctx/tool/fs.read execute",  # path matching
    "allow coder_t tool:{name} execute",  # template
    "allow coder_t agent:<child> create",  # template
    "inherit coder_t tool:fs.read execute",  # inheritance
    "priority 10",
    "deny coder_t network:default connect",  # no deny
    "allow coder_t",
    "allow",
]


def test_p2_every_forbidden_form_is_einval_on_its_line(tmp_path):
    """P-2: "No deny, no glob (*), no priority, no inheritance, no variables, no path matching,
    no templates"; P-1: a rule is ``allow <subject_type> <object_class>:<object_name>
    <permission>``.  Anything else is an error of its own line (P-8: ``FILE:LINE: EINVAL``),
    and a policy holding one decides nothing (exit 2 from ``query``), even for a rule it
    holds."""
    policy = tmp_path / "policy"
    policy.write_text(
        "# header\nallow coder_t tool:fs.read execute\n" + "\n".join(FORBIDDEN) + "\n"
    )
    r = ctx_run("policy", "check", policy)
    assert r.rc == 1, r
    assert sorted(error_lines(r, policy)) == list(range(3, 3 + len(FORBIDDEN))), r
    r = ctx_run("policy", "query", "--policy", policy, "coder_t", "tool:fs.read", "execute")
    assert r.rc == 2 and "EINVAL" in r.err and r.out == "", r


ILLEGAL_OBJECTS = [
    "tool:fs.d",  # ends in .d
    "tool:.hidden",  # first byte not alphanumeric
    "tool:-x",
    "shared:..",
    "tool:" + "a" * 65,  # longer than 64 bytes
    "tool:caf\u00e9",  # not ASCII
    "tool:fs/read",  # '/' in an object name
    "tool:",  # empty
    "model:gpt-5",  # a model is <provider>/<model>
    "model:openai/gpt/5",
    "model:openai/.x",  # each part an object name
]


def test_p3_an_object_name_that_is_not_an_object_name_is_einval(tmp_path):
    """P-7, R-3: rules name concrete objects by their names: 1 to 64 bytes of
    ``[A-Za-z0-9._-]``, first byte alphanumeric, not ending in ``.d``; a model is
    ``<provider>/<model>``, each part an object name.  Anything else is EINVAL (R-3), in a
    policy line as in a query."""
    policy = tmp_path / "policy"
    policy.write_text("".join(f"allow coder_t {obj}{perm_of(obj)}\n" for obj in ILLEGAL_OBJECTS))
    r = ctx_run("policy", "check", policy)
    assert r.rc == 1 and sorted(error_lines(r, policy)) == list(range(1, 12)), r
    for obj in ILLEGAL_OBJECTS:
        r = ctx_run("policy", "query", "--policy", os.devnull, "coder_t", obj, perm_of(obj)[1:])
        assert r.rc == 2 and "EINVAL" in r.err and r.out == "", r


def perm_of(obj: str) -> str:
    return " " + sorted(CLASSES[obj.split(":", 1)[0]][1])[0]


def test_p3_a_name_of_64_bytes_is_a_name(tmp_path):
    """R-3: 64 bytes is the longest object name, and a legal one."""
    name = "a" * 63 + "9"
    policy = tmp_path / "policy"
    policy.write_text(f"allow coder_t tool:{name} execute\n")
    assert ctx_run("policy", "check", policy).rc == 0
    r = ctx_run("policy", "query", "--policy", policy, "coder_t", f"tool:{name}", "execute")
    assert (r.rc, r.out) == (0, "allow\n"), r


def test_p1_blanks_are_spaces_and_tabs_and_an_indented_hash_is_a_comment(tmp_path):
    """P-1: "Blank lines and lines whose first non-blank character is # are ignored": a tab
    before ``#`` is blank too, and so is a line of blanks only; words are separated by blanks."""
    policy = tmp_path / "policy"
    policy.write_text(
        "\t# a comment after a tab\n"
        " \t \n"
        "allow\tcoder_t\ttool:fs.read\texecute\n"
        "  allow  coder_t  tool:fs.list  execute  \n"
        "\n"
    )
    r = ctx_run("policy", "check", policy)
    assert (r.rc, r.err) == (0, ""), r
    for tool in ("fs.read", "fs.list"):
        r = ctx_run("policy", "query", "--policy", policy, "coder_t", f"tool:{tool}", "execute")
        assert (r.rc, r.out) == (0, "allow\n"), r


@pytest.mark.parametrize(
    "query",
    [
        ("*_t", "tool:fs.read", "execute"),  # a glob subject (P-2)
        ("x t", "tool:fs.read", "execute"),
        ("x_t", "toolfs.read", "execute"),  # no CLASS:NAME
        ("x_t", "tool:fs.read", "use"),  # a permission of another class (P-3)
        ("x_t", "network:default", "execute"),
    ],
)
def test_p8_a_malformed_query_decides_nothing(tmp_path, query):
    """P-8: "a malformed query or policy is exit 2 with EINVAL": whatever part of the query
    is malformed, and though the policy holds rules, stdout carries no decision."""
    policy = tmp_path / "policy"
    policy.write_text("allow x_t tool:fs.read execute\nallow x_t network:default connect\n")
    r = ctx_run("policy", "query", "--policy", policy, *query)
    assert r.rc == 2 and "EINVAL" in r.err and r.out == "", r


def test_p2_an_empty_policy_denies_everything(tmp_path):
    """P-2 default deny: a policy of comments only grants nothing, in any class."""
    policy = tmp_path / "policy"
    policy.write_text("# nothing here\n\n")
    assert ctx_run("policy", "check", policy).rc == 0
    for cls, (name, perms) in CLASSES.items():
        perm = sorted(perms)[-1]
        r = ctx_run("policy", "query", "--policy", policy, "x_t", f"{cls}:{name}", perm)
        assert (r.rc, r.out) == (1, "deny\n"), r


def test_p8_check_reads_standard_input_for_dash():
    """P-8 ``ctx policy check FILE...``: ``-`` is standard input (docs/policy.md); valid is 0,
    invalid 1 with the ``EINVAL`` line."""
    r = ctx_run("policy", "check", "-", input="allow x_t tool:fs.read execute\n")
    assert (r.rc, r.err) == (0, ""), r
    r = ctx_run("policy", "check", "-", input="allow x_t tool:fs.read run\n")
    assert r.rc == 1 and re.search(r":1: EINVAL: ", r.err), r


# ------------------------------------------------------------------ T-4, T-8a: CTX_PATH


def executable(directory: Path, name: str, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def which(storage: Path, name: str, *, home: Path | None = None, path: str | None = None) -> Run:
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home or storage / "no-home"))
    if path is not None:
        env["CTX_PATH"] = path
    return ctx_run("object", "which", name, env=env)


def test_t4_the_first_directory_holding_an_executable_wins(storage, tmp_path):
    """T-4: "left to right, the first directory holding an executable file of that name wins"."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        executable(d, "demo.x")
    r = which(storage, "demo.x", path=f"{a}:{b}:{c}")
    assert (r.rc, r.out) == (0, f"{a / 'demo.x'}\n"), r
    r = which(storage, "demo.x", path=f"{c}:{a}:{b}")
    assert (r.rc, r.out) == (0, f"{c / 'demo.x'}\n"), r


@pytest.mark.parametrize("kind", ["not executable", "directory"])
def test_t4_a_file_that_is_not_executable_is_not_a_hit(storage, tmp_path, kind):
    """T-4: "a non-executable file is not a hit": the search goes on to the next directory;
    T-8a: with nothing executable left, exit 1 and no path on stdout."""
    a, b = tmp_path / "a", tmp_path / "b"
    if kind == "directory":
        (a / "demo.x").mkdir(parents=True)
    else:
        executable(a, "demo.x", 0o644)
    executable(b, "demo.x")
    r = which(storage, "demo.x", path=f"{a}:{b}")
    assert (r.rc, r.out) == (0, f"{b / 'demo.x'}\n"), r
    r = which(storage, "demo.x", path=str(a))
    assert r.rc == 1 and r.out == "", r


def test_t8a_which_of_a_name_nowhere_is_exit_1(storage, tmp_path):
    """T-8a: ``ctx object which NAME`` "(exit 1 when none)", stdout empty."""
    r = which(storage, "demo.none", path=str(tmp_path))
    assert (r.rc, r.out) == (1, ""), r
    r = which(storage, "demo.none")
    assert (r.rc, r.out) == (1, ""), r


@pytest.mark.parametrize("name", ["../tool/fs.read", "tool/fs.read", "fs.read.d", ""])
def test_t8a_which_of_an_illegal_name_is_einval_never_a_path(storage, name):
    """T-8a, R-3: NAME is a tool name, an object name; anything else is EINVAL (a usage
    error, exit 2), never a path reached by walking out of a ``CTX_PATH`` directory."""
    r = which(storage, name, path=str(storage / "home"))
    assert r.rc == 2 and "EINVAL" in r.err and r.out == "", r


def test_t4_tshrc_comes_before_the_process_ctx_path(storage, tmp_path):
    """T-4: the search path of a standalone human: (1) ``CTX_PATH=`` in ``$CTX_HOME/.tshrc``
    if present, (2) the process ``CTX_PATH``, (3) the default."""
    a, b = tmp_path / "a", tmp_path / "b"
    executable(a, "demo.x")
    executable(b, "demo.x")
    home = tmp_path / "home"
    home.mkdir()
    r = which(storage, "demo.x", home=home, path=str(b))
    assert r.out == f"{b / 'demo.x'}\n", r  # no .tshrc: the process CTX_PATH
    (home / ".tshrc").write_text(f"# mine\nCTX_PATH={a}\n")
    r = which(storage, "demo.x", home=home, path=str(b))
    assert (r.rc, r.out) == (0, f"{a / 'demo.x'}\n"), r


def test_t4_the_default_path_is_the_system_tier_then_the_users(storage):
    """T-4 (3): default ``/ctx/tool:/ctx/home/<uid>/tool`` (``/ctx`` being the storage root
    when not mounted): a name in both is the system tier's; one only in the user tier is
    found there."""
    system = executable(storage / "tool", "demo.both")
    user_tier = storage / "home" / str(os.getuid()) / "tool"
    executable(user_tier, "demo.both")
    only_user = executable(user_tier, "demo.mine")
    r = which(storage, "demo.both")
    assert (r.rc, r.out) == (0, f"{system}\n"), r
    r = which(storage, "demo.mine")
    assert (r.rc, r.out) == (0, f"{only_user}\n"), r


def test_t4_tshrc_is_data_never_code(storage, tmp_path):
    """T-4: "``.tshrc`` is data, never code": command substitutions, backquotes and shell
    statements in it are never run."""
    home = tmp_path / "home"
    home.mkdir()
    marks = [tmp_path / f"mark{i}" for i in range(3)]
    (home / ".tshrc").write_text(
        f"CTX_PATH=$(touch {marks[0]})\n`touch {marks[1]}`\ntouch {marks[2]}\n"
    )
    which(storage, "fs.read", home=home)
    assert not any(mark.exists() for mark in marks)


# ------------------------------------------------------------------ T-8a: ctx object list --tier


def install(storage: Path, top: Path, name: str, tier: str) -> Run:
    manifest = tool_manifest(top, name, PROGRAM)
    return ctx_run(
        "object", "install", manifest, "--tier", tier, env=clean_env(CTX_STORAGE=str(storage))
    )


TIERS = {"system": "demo.sys", "user": "demo.usr", "shared:proj": "demo.shr"}


def test_t8a_list_tier_lists_only_that_tier(storage, tmp_path):
    """T-8a: ``ctx object list [--tier T]`` lists installed objects; without ``--tier`` every
    tier's, each with its tier; ``--tier`` keeps that tier's alone (T-8: ``system|user|
    shared:<name>``), in the text and the ``--json`` output alike."""
    for tier, name in TIERS.items():
        r = install(storage, tmp_path, name, tier)
        assert r.rc == 0, r
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctx_run("object", "list", "--json", env=env)
    assert r.rc == 0, r
    tiers = {e["name"]: e["tier"] for e in r.json()}
    assert {name: tiers.get(name) for name in [*TIERS.values(), "fs.read"]} == {
        **{name: tier for tier, name in TIERS.items()},
        "fs.read": "system",
    }, tiers
    for tier, name in TIERS.items():
        r = ctx_run("object", "list", "--tier", tier, env=env)
        assert r.rc == 0, r
        listed = {line.split()[0] for line in r.lines() if line.strip()}
        assert listed & set(TIERS.values()) == {name}, r
        r = ctx_run("object", "list", "--tier", tier, "--json", env=env)
        assert r.rc == 0, r
        assert {e["name"] for e in r.json()} & set(TIERS.values()) == {name}, r
        assert {e["tier"] for e in r.json()} == {tier}, r


def test_t8a_a_malformed_tier_is_a_usage_error(storage, tmp_path):
    """T-8 / T-8a: a tier is ``system|user|shared:<name>``, the name an object name (R-3:
    anything else is EINVAL); a malformed one is a usage error, for list and install, and
    nothing is installed anywhere."""
    env = clean_env(CTX_STORAGE=str(storage))
    manifest = write_manifest(tmp_path)
    before = sorted(str(p.relative_to(storage)) for p in storage.rglob("*"))
    for tier in ("bogus", "shared:", "shared:.bad", "shared:a/b", "system:x", "User"):
        r = ctx_run("object", "list", "--tier", tier, env=env)
        assert r.rc == 2 and "EINVAL" in r.err and r.out == "", r
        r = ctx_run("object", "install", manifest, "--tier", tier, env=env)
        assert r.rc == 2 and "EINVAL" in r.err, r
    assert sorted(str(p.relative_to(storage)) for p in storage.rglob("*")) == before


def test_t8a_list_of_a_space_never_created_is_enoent(storage):
    """T-8a (docs/tools.md): a tier whose directory does not exist is ENOENT, exit 1."""
    r = ctx_run("object", "list", "--tier", "shared:never", env=clean_env(CTX_STORAGE=str(storage)))
    assert r.rc == 1 and "ENOENT" in r.err, r


# ------------------------------------------------------------------ T-8: manifests


def write_manifest(top: Path, **fields) -> Path:
    program = top / "prog.sh"
    program.write_text(PROGRAM)
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "demo.fault",
        "description": "A test tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": "prog.sh",
    }
    for key, value in fields.items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = value
    path = top / "m.json"
    path.write_text(json.dumps(document))
    return path


MCP = {"transport": "stdio", "config": "/etc/mcp.json", "server": "gh", "tool": "search"}


MANIFEST_FAULTS = [
    {"manifest": True},
    {"manifest": None},
    {"kind": "Tool"},
    {"kind": None},
    {"name": "caf\u00e9"},
    {"name": "a" * 65},
    {"name": ".."},
    {"name": "-x"},
    {"name": "a b"},
    {"description": ""},
    {"description": None},
    {"cap": None},
    {"cap": {"network": 1}},
    {"cap": {"side_effects": 0, "network": False}},
    {"exec": ""},
    {"exec": None},  # neither exec nor mcp
    {"extra": 1},
    {"mcp": MCP, "exec": None, "name": "demo.fault"},  # not <server>.<tool> (M-3)
    {"mcp": {**MCP, "transport": "http"}, "exec": None, "name": "gh.search"},
    {"mcp": {**MCP, "config": "mcp.json"}, "exec": None, "name": "gh.search"},
    {"mcp": {k: v for k, v in MCP.items() if k != "tool"}, "exec": None, "name": "gh.search"},
    {"mcp": MCP, "name": "gh.search"},  # both exec and mcp
]


def test_t8_every_fault_of_a_v2_manifest_is_refused(tmp_path):
    """T-8: a v2 manifest is one JSON object ``{"manifest": 2, "kind": "tool", "name",
    "description", "schema", "cap", "exec" | "mcp", "program"?}``; ``cap`` boolean facts;
    names are object names (R-3, EINVAL); an ``mcp`` locator is strict (M-4, M-3).  ``check``
    of them all exits 1 with ``MANIFEST: EINVAL: <reason>`` lines naming each one."""
    paths = []
    for number, fault in enumerate(MANIFEST_FAULTS):
        directory = tmp_path / f"fault{number}"
        directory.mkdir()
        paths.append(write_manifest(directory, **fault))
    r = ctx_run("object", "check", *paths)
    assert r.rc == 1 and r.out == "", r
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert all(line.split(": ", 1)[1].startswith("EINVAL: ") for line in lines), r
    for path, fault in zip(paths, MANIFEST_FAULTS, strict=True):
        assert any(line.startswith(f"{path}: EINVAL: ") for line in lines), (fault, r)


@pytest.mark.parametrize("fault", [{"extra": 1}, {"mcp": MCP, "name": "gh.search"}])
def test_t8_install_refuses_a_faulty_manifest_and_makes_nothing(tmp_path, storage, fault):
    """T-8: ``install`` validates as ``check`` does: a manifest with a field no v2 manifest
    has, or with both ``exec`` and ``mcp``, is EINVAL and installs nothing."""
    path = write_manifest(tmp_path, **fault)
    before = sorted(os.listdir(storage / "tool"))
    r = ctx_run("object", "install", path, "--tier", "system",
                env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip
    assert r.rc != 0 and "EINVAL" in r.err, r
    assert sorted(os.listdir(storage / "tool")) == before


@pytest.mark.parametrize("text", ["[1]", "nope", '"tool"', ""])
def test_t8_a_manifest_that_is_not_one_json_object_is_einval(tmp_path, text):
    """T-8: "A v2 manifest is one JSON object"."""
    path = tmp_path / "m.json"
    path.write_text(text)
    r = ctx_run("object", "check", path)
    assert r.rc == 1 and f"{path}: EINVAL: " in r.err, r


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "a" * 63 + "9"},
        {"cap": {}},
        {"cap": {"side_effects": True, "network": True, "gpu": "a100"}},
        {"mcp": MCP, "exec": None, "name": "gh.search"},
    ],
    ids=["64-byte-name", "empty-cap", "cap-with-facts", "mcp"],
)
def test_t8_a_valid_manifest_is_valid(tmp_path, fields):
    """T-8: ``cap`` "declares facts such as" side_effects and network (so other facts, or
    none, are facts too); ``"exec" | "mcp"``; a 64-byte name is an object name (R-3)."""
    r = ctx_run("object", "check", write_manifest(tmp_path, **fields))
    assert (r.rc, r.err) == (0, ""), r


@pytest.mark.parametrize("tier", ["system", "user", "shared:proj"])
def test_t8_install_grants_nothing_in_any_tier(storage, tmp_path, tier):
    """T-8: "Installing grants no agent any permission", whichever tier: the new tool's own
    policy is a valid policy that allows nobody, and no agent's control changes."""
    agents_before = {
        p: p.read_bytes() for p in (storage / "agent").rglob("*") if p.is_file() and p.name != "log"
    }
    r = install(storage, tmp_path, "demo.new", tier)
    assert r.rc == 0, r
    tier_dir = {
        "system": storage / "tool",
        "user": storage / "home" / str(os.getuid()) / "tool",
        "shared:proj": storage / "shared" / "proj" / "tool",
    }[tier]
    policy = tier_dir / "demo.new.d" / "policy"
    assert ctx_run("policy", "check", policy).rc == 0
    rules = [
        line for line in policy.read_text().splitlines() if line.strip() and line.strip()[0] != "#"
    ]
    assert rules == [], rules
    assert {
        p: p.read_bytes() for p in (storage / "agent").rglob("*") if p.is_file() and p.name != "log"
    } == agents_before


# ------------------------------------------------------------------ agents: what create writes


def create_agent(storage: Path, tmp_path: Path, request: dict, *args: str) -> Run:
    path = tmp_path / f"{request.get('name', 'x')}-request.json"
    path.write_text(json.dumps(request))
    return ctx_run("agent", "create", *args, path, env=clean_env(CTX_STORAGE=str(storage)))


def rules_of(policy: Path) -> set[str]:
    return {
        " ".join(line.split())
        for line in policy.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }


def test_p6_create_writes_a_valid_policy_of_exact_rules_and_no_tool_or_shared_control(
    storage, tmp_path
):
    """A-3, P-6, P-7, S-6: the agent's grants are rules of its label in
    ``agent/<name>.d/policy`` — a valid policy — one per concrete name; there is no
    ``agent/<name>.d/tool`` and no ``agent/<name>.d/shared``; no new root entry (A-3)."""
    request = {"name": "rev", "label": "rev_t", "tools": ["fs.read", "fs.list"],
               "model": ["openai/gpt-5.6"], "shared": {"proj": ["read", "write"]},
               "mount": []}  # fmt: skip
    r = create_agent(storage, tmp_path, request)
    assert r.rc == 0, r
    controls = storage / "agent" / "rev.d"
    policy = controls / "policy"
    assert ctx_run("policy", "check", policy).rc == 0
    rules = rules_of(policy)
    assert {
        "allow rev_t tool:fs.read execute",
        "allow rev_t tool:fs.list execute",
        "allow rev_t model:openai/gpt-5.6 use",
        "allow rev_t shared:proj read",
        "allow rev_t shared:proj write",
    } <= rules, rules
    assert all(rule.startswith("allow rev_t ") for rule in rules), rules
    assert not any(":fs.stat " in rule or "shell.exec" in rule for rule in rules), rules
    assert not (controls / "tool").exists() and not (controls / "shared").exists()
    assert set(os.listdir(storage)) == ROOT_ENTRIES


@pytest.mark.parametrize(
    "fault",
    [
        {"tools": ["*"]},
        {"tools": ["fs.*"]},
        {"tools": ["fs.d"]},
        {"shared": {"proj": ["execute"]}},
        {"model": ["gpt-5"]},
        {"name": "bad.d"},
        {"name": "../x"},
        {"label": "a b"},
        {"tools": "fs.read"},  # model and tools are lists
        {"model": "openai/gpt-5.6"},
        {"mount": [["/tmp", "/w"]]},  # [source, target, "ro"|"rw"]
        {"mount": [["/tmp", "/w", "rx"]]},
        {"name": None},
        {"label": None},
    ],
    ids=lambda fault: json.dumps(fault)[:40],
)
def test_p2_a_request_no_policy_can_express_creates_nothing(storage, tmp_path, fault):
    """A-3 with P-2, P-3, R-3: a request whose grants are no policy rule (a glob, an illegal
    name, a permission of no class), or that is not of A-3's shape (``model`` and ``tools``
    lists, ``mount`` a list of ``[source, target, "ro"|"rw"]``, ``name`` and ``label``
    given), is EINVAL and creates nothing."""
    before = sorted(os.listdir(storage / "agent"))
    request = {"name": "kid", "label": "kid_t", **fault}
    r = create_agent(storage, tmp_path, {k: v for k, v in request.items() if v is not None})
    assert r.rc != 0 and "EINVAL" in r.err, r
    assert sorted(os.listdir(storage / "agent")) == before


def test_a3_an_existing_agent_is_never_overwritten(storage, tmp_path):
    """A-3 (``ctx agent create --help``): creating an agent of an existing name is refused
    and its controls are left exactly as they were."""
    r = create_agent(storage, tmp_path, {"name": "kid", "label": "kid_t", "tools": ["fs.read"]})
    assert r.rc == 0, r
    controls = storage / "agent" / "kid.d"
    before = {p.name: p.read_bytes() for p in controls.iterdir() if p.name != "log"}
    r = create_agent(storage, tmp_path, {"name": "kid", "label": "other_t",
                                         "tools": ["shell.exec"]})  # fmt: skip
    assert r.rc == 1 and "EEXIST" in r.err, r
    assert {p.name: p.read_bytes() for p in controls.iterdir() if p.name != "log"} == before


# ------------------------------------------------------------------ T-4: the control directory


@pytest.fixture
def space_world(tmp_path_factory) -> Iterator[tuple[Path, Path]]:
    """A storage root every uid may search, a space ``proj`` of group 4243 holding the tool
    demo.sp (installed by its owner, root), and agent ``coder`` (nobody, in group 4243) whose
    policy grants demo.sp and reading the space; demo.sp's own policy grants it too."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-letter-", dir="/tmp"))
    top.chmod(0o755)
    try:
        storage, workspace = top / "storage", top / "ws"
        workspace.mkdir()
        workspace.chmod(0o777)
        env = clean_env(CTX_STORAGE=str(storage))
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        r = ctx_run("shared", "create", "proj", "--group", "4243", env=env)
        assert r.rc == 0, r
        r = install(storage, top, "demo.sp", "shared:proj")
        assert r.rc == 0, r
        controls = storage / "shared" / "proj" / "tool" / "demo.sp.d"
        with (controls / "policy").open("a") as policy:
            policy.write("allow coder_t tool:demo.sp execute\n")
        request = {"name": "coder", "label": "coder_t", "tools": ["demo.sp"],
                   "shared": {"proj": ["read"]},
                   "mount": [[str(workspace), "/workspace", "rw"]]}  # fmt: skip
        (top / "coder.json").write_text(json.dumps(request))
        r = ctx_run("agent", "create", "--groups", "4243", top / "coder.json", env=env)
        assert r.rc == 0, r
        yield storage, workspace
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a tool as another uid")
def test_t4_the_control_directory_is_the_one_beside_the_executable(space_world):
    """T-4: "the control dir ``.d/`` comes from the directory that held the executable": a
    ``tool/demo.sp.d/`` in an earlier ``CTX_PATH`` directory (the system tier) without an
    executable beside it — whose status says disabled and whose policy grants nothing — is
    not the tool's; the space's tool runs with its own controls and logs in its own log."""
    storage, workspace = space_world
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctx_run("run", "--agent", "coder", "demo.sp", env=env)
    assert r.rc == 0, r
    stray = storage / "tool" / "demo.sp.d"
    (stray / "hooks" / "pre.d").mkdir(parents=True)
    (stray / "hooks" / "post.d").mkdir(parents=True)
    for control, text in {"name": "demo.sp\n", "description": "stray\n", "schema": "{}\n",
                          "cap": "{}\n", "policy": "# nothing\n", "status": "disabled\n",
                          "log": ""}.items():  # fmt: skip
        (stray / control).write_text(text)
    (workspace / "ran").unlink()
    r = ctx_run("run", "--native", "--agent", "coder", "demo.sp", input="{}", env=env)
    assert r.rc == 0, r
    assert (workspace / "ran").read_text().split() == ["ran", "demo.sp"]
    assert (stray / "log").read_text() == ""
    own_log = storage / "shared" / "proj" / "tool" / "demo.sp.d" / "log"
    call = json.loads(r.lines()[-1])["call"]
    assert call in own_log.read_text()
    # T-4: "a non-executable file is not a hit": one at tool/demo.sp leaves the space's tool
    # the hit, with its own controls still.
    (storage / "tool" / "demo.sp").write_text("#!/bin/sh\necho stray >> ran\n")
    (storage / "tool" / "demo.sp").chmod(0o644)
    r = ctx_run("run", "--agent", "coder", "demo.sp", env=env)
    assert r.rc == 0, r
    assert (workspace / "ran").read_text().split() == ["ran", "demo.sp", "ran", "demo.sp"]
    search = f"{storage / 'tool'}:{storage / 'shared/proj/tool'}"
    r = ctx_run("object", "which", "demo.sp", env={**env, "CTX_PATH": search})
    assert r.out == f"{storage / 'shared/proj/tool/demo.sp'}\n", r


# ------------------------------------------------------------------ S-1, S-5: sessions on disk


EVENT = (
    '{{"ts":"2026-06-22T12:00:0{i}Z","type":"note","agent":"bob","session":"{s}",'
    '"object":"tool/fs.read","status":"ok","i":{i}}}\n'
)


@pytest.fixture
def bob(storage: Path) -> Path:
    """Sessions s1 (three whole events) and s2 (empty) of agent bob in root's home; bob has
    no entry in agent/ (sessions outlive their agent, docs/sessions.md)."""
    sessions = storage / "home" / str(os.getuid()) / "agent" / "bob" / "session"
    for name in ("s1", "s2"):
        (sessions / name).mkdir(parents=True)
    (sessions / "s1" / "events.jsonl").write_text(
        "".join(EVENT.format(i=i, s="s1") for i in (1, 2, 3))
    )
    (sessions / "s2" / "events.jsonl").write_text("")
    return sessions


def session(storage: Path, command: str, *args: str) -> Run:
    return ctx_run("session", command, "bob", *args, env=clean_env(CTX_STORAGE=str(storage)))


def test_s1_list_names_each_session_directory(storage, bob):
    """S-1: sessions are ordinary directories; ``ctx session list`` prints one name a line,
    ``--json`` one array of ``{"name", "path"}`` (path: the session's directory)."""
    r = session(storage, "list")
    assert (r.rc, r.lines()) == (0, ["s1", "s2"]), r
    r = session(storage, "list", "--json")
    assert r.rc == 0, r
    assert sorted(r.json(), key=lambda e: e["name"]) == [
        {"name": "s1", "path": str(bob / "s1")},
        {"name": "s2", "path": str(bob / "s2")},
    ]


def test_s5_tail_n_prints_the_last_events_oldest_first(storage, bob):
    """S-5 readers: ``ctx session tail -n N --json`` prints the last N events as stored."""
    r = session(storage, "tail", "s1", "-n", "2", "--json")
    assert r.rc == 0, r
    assert [json.loads(line)["i"] for line in r.lines()] == [2, 3]
    r = session(storage, "tail", "s1", "-n", "0", "--json")
    assert (r.rc, r.out) == (0, ""), r


def test_s5_a_last_line_without_its_newline_is_torn_even_when_it_parses(storage, bob):
    """S-5: one event = one line written with a single write; a last line without its
    newline is a write that never completed, however it reads: readers ignore it, repair
    truncates exactly it."""
    events = bob / "s1" / "events.jsonl"
    whole = events.read_bytes()
    torn = EVENT.format(i=4, s="s1").rstrip("\n")
    events.write_bytes(whole + torn.encode())
    for command in ("show", "tail"):
        r = session(storage, command, "s1", "--json")
        assert r.rc == 0, r
        assert [json.loads(line)["i"] for line in r.lines()] == [1, 2, 3], r
    r = session(storage, "repair", "s1", "--json")
    assert r.rc == 0, r
    assert r.json()["truncated_bytes"] == len(torn), r
    assert events.read_bytes() == whole


def test_s5_a_file_of_one_torn_line_repairs_to_empty(storage, bob):
    """S-5: a torn line with nothing whole before it: read as no event, repaired to nothing."""
    events = bob / "s2" / "events.jsonl"
    events.write_bytes(b'{"ts":"2026-06-22T12:00:0')
    r = session(storage, "show", "s2", "--json")
    assert (r.rc, r.out) == (0, ""), r
    r = session(storage, "repair", "s2", "--json")
    assert r.rc == 0 and r.json()["truncated_bytes"] == 25, r
    assert events.read_bytes() == b""


def test_s5_repair_of_whole_lines_changes_nothing_and_exits_0(storage, bob):
    """S-5: repair truncates a torn last line only: a file of whole lines is left as it is,
    ``truncated_bytes`` 0, exit 0, and so is a second repair."""
    events = bob / "s1" / "events.jsonl"
    whole = events.read_bytes()
    for _ in range(2):
        r = session(storage, "repair", "s1", "--json")
        assert r.rc == 0 and r.json()["truncated_bytes"] == 0, r
        assert set(r.json()) >= {"session", "truncated_bytes"}, r
    assert events.read_bytes() == whole


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a tool as another uid")
def test_t4_an_agents_ctx_path_is_the_runtimes_not_the_callers(space_world, tmp_path):
    """T-4: "Inside an agent terminal the runtime-injected CTX_PATH (derived from policy,
    mounts and uid/gid) is authoritative": a ``CTX_PATH`` in the caller's environment, or in
    a ``.tshrc`` of its ``CTX_HOME``, naming a directory with a tool of the same name, does
    not change which tool the agent runs; and the space's tools are on the agent's path
    only while its policy holds ``shared:proj read``."""
    storage, workspace = space_world
    planted = tmp_path / "planted"
    planted.mkdir()
    planted.chmod(0o755)
    executable(planted, "demo.sp").write_text("#!/bin/sh\necho planted >> ran\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tshrc").write_text(f"CTX_PATH={planted}\n")
    env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(planted), CTX_HOME=str(home))
    for native in (False, True):
        args = ["--native"] if native else []
        r = ctx_run("run", *args, "--agent", "coder", "demo.sp", input="{}", env=env)
        assert r.rc == 0, r
    assert (workspace / "ran").read_text().split() == ["ran", "demo.sp"] * 2
    policy = storage / "agent" / "coder.d" / "policy"
    policy.write_text(policy.read_text().replace("allow coder_t shared:proj read\n", ""))
    r = ctx_run("run", "--native", "--agent", "coder", "demo.sp", input="{}", env=env)
    assert r.rc == 1, r
    error = json.loads(r.lines()[-1])["error"]
    assert error["error"] in ("ENOENT", "EACCES"), error
    assert (workspace / "ran").read_text().split() == ["ran", "demo.sp"] * 2


def test_s1_list_of_a_shared_space_names_its_sessions(storage):
    """S-1: ``shared/<name>/agent/<agent>/session/<session>/`` are sessions too; ``ctx session
    list --project`` names them, with their directories."""
    sessions = storage / "shared" / "proj" / "agent" / "bob" / "session"
    for name in ("build", "review"):
        (sessions / name).mkdir(parents=True)
        (sessions / name / "events.jsonl").write_text(EVENT.format(i=1, s=name))
    r = session(storage, "list", "--project", "proj", "--json")
    assert r.rc == 0, r
    assert sorted(r.json(), key=lambda e: e["name"]) == [
        {"name": "build", "path": str(sessions / "build")},
        {"name": "review", "path": str(sessions / "review")},
    ]
    r = session(storage, "show", "review", "--project", "proj", "--json")
    assert (r.rc, [json.loads(line)["session"] for line in r.lines()]) == (0, ["review"]), r


def test_s5_follow_skips_a_torn_line_and_reads_what_the_next_append_writes(storage, bob):
    """S-5: readers ignore a torn last line, and the next append never glues onto it (the
    appender cuts it first): ``tail --follow`` started over a torn line prints the event
    written in its place, whole, and never the fragment."""
    events = bob / "s1" / "events.jsonl"
    whole = events.read_bytes()
    events.write_bytes(whole + b'{"ts":"2026-06-22T12:00:0')
    command = [*CTX_ARGV, "session", "tail", "bob", "s1", "--follow", "--json", "-n", "1"]
    env = clean_env(CTX_STORAGE=str(storage))
    with subprocess.Popen(command, stdout=subprocess.PIPE, env=env, text=True) as follower:
        try:
            first = follower.stdout.readline()
            assert json.loads(first)["i"] == 3, first
            with events.open("r+b") as log:  # what an appender does after a crash
                log.truncate(len(whole))
                log.seek(0, os.SEEK_END)
                log.write(EVENT.format(i=7, s="s1").encode())
            later = follower.stdout.readline()
            assert json.loads(later)["i"] == 7, later
        finally:
            follower.kill()


def test_t4_the_default_user_tier_is_the_callers_own(unprivileged_user):
    """T-4 (3): the default ``/ctx/tool:/ctx/home/<uid>/tool`` names the caller's uid: a
    user who sets no path finds the tools of ``home/<their uid>/tool`` (after the system
    tier), and not those of another uid's tier."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-letter-", dir="/tmp"))
    try:
        top.chmod(0o755)
        storage = top / "storage"
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        mine = executable(storage / "home" / str(unprivileged_user.uid) / "tool", "demo.mine")
        executable(storage / "home" / str(unprivileged_user.uid) / "tool", "fs.read")
        executable(storage / "home" / str(os.getuid()) / "tool", "demo.roots")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CTX_STORAGE": str(storage)}
        found = {}
        for name in ("demo.mine", "fs.read", "demo.roots"):
            done = run_as(unprivileged_user, [*CTX_ARGV, "object", "which", name], env=env,
                          stdin="")  # fmt: skip
            found[name] = (done.returncode, done.stdout)
        assert found == {
            "demo.mine": (0, f"{mine}\n"),
            "fs.read": (0, f"{storage / 'tool' / 'fs.read'}\n"),
            "demo.roots": (1, ""),
        }, found
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a set-user-id program of another uid")
def test_t8_install_never_grants_a_set_id_bit_or_the_programs_owner(storage, tmp_path):
    """T-8: "Installing grants no agent any permission": a program whose file is
    set-user-id or set-group-id (here another uid's) is installed without those bits and as
    the host's file, so running the tool never runs with anyone's privileges but the
    agent's own."""
    r = install(storage, tmp_path, "demo.setid", "system")
    assert r.rc == 0, r
    program = tmp_path / "demo.setid.sh"
    os.chown(program, 4321, 4321)
    program.chmod(0o6755)
    for tier, directory in (("user", storage / "home" / str(os.getuid()) / "tool"),
                            ("system", storage / "tool")):  # fmt: skip
        manifest = tmp_path / "demo.setid.json"
        r = ctx_run("object", "install", manifest, "--tier", tier,
                    env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip
        assert r.rc == 0, r
        installed = os.stat(directory / "demo.setid")
        assert installed.st_mode & 0o7000 == 0, oct(installed.st_mode)
        assert installed.st_mode & 0o111, oct(installed.st_mode)
        assert installed.st_uid != 4321 and installed.st_gid != 4321, installed


def test_t8a_an_entry_whose_name_is_no_object_name_is_not_listed(storage):
    """T-8a with R-3: ``ctx object list`` lists installed objects, and a file whose name is
    not an object name (a blank in it, not ASCII, a leading dot) is none, however
    executable; nor is a control directory (``.d``)."""
    for name in ("bad name", "caf\u00e9", ".hidden", "-dash"):
        executable(storage / "tool", name)
    r = ctx_run("object", "list", "--tier", "system", "--json",
                env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip
    assert r.rc == 0, r
    names = [entry["name"] for entry in r.json()]
    assert "fs.read" in names, names
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", n) for n in names), names
    assert not any(n.endswith(".d") for n in names), names
