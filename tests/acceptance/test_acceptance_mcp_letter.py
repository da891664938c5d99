"""Acceptance tests of the letter of §10 (``ctxmcp``, M-1 … M-4), §11 (C-1, C-2) and R-2's
"no ``mcp/``", for the claims test_acceptance_mcp.py leaves open: the exact workflow SPEC
spells (``ctx object install --source``), which fields a candidate holds and which it must
not (no output schema, no ``program`` inferred from an MCP source), what each refusal exits
with and names, the ``--json`` shapes, and ``ctxmcp``'s own command line.

The servers are real stdio MCP servers: the published ``mcp-server-time``, servers built on
the published MCP SDK, and a small scripted server for what no published server does on
request.  Nothing of the product is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import ROOT_ENTRIES, clean_env, ctx_run, snapshot
from tests.acceptance.test_acceptance_mcp import (
    CTXMCP,
    RUNTIME_CONFIG,
    ctxmcp,
    listed_status,
    mcp_manifest,
    project,
    received,
    scripted_config,
    time_config,
    write_json,
)

# T-8: "A v2 manifest is one JSON object: {"manifest": 2, "kind": "tool", "name",
# "description", "schema", "cap", "exec" | "mcp", "program"?}".
CANDIDATE_FIELDS = {"manifest", "kind", "name", "description", "schema", "cap", "mcp"}
# T-1: the controls every tool has, plus M-4's optional mcp control for a projected one.
TOOL_CONTROLS = ["name", "description", "schema", "cap", "policy", "status", "log"]
ECHO = {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}
PROGRAM = {"type": "object", "additionalProperties": False}

# A remote tool that declares an output schema (MCP's structured output) and every annotation
# of a read-only, deterministic, closed-world tool, as the MCP SDK serves such a function.
ADD = {
    "name": "add",
    "description": "adds two integers",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    "outputSchema": {
        "type": "object",
        "properties": {"sum": {"type": "integer"}},
        "required": ["sum"],
        "additionalProperties": False,
    },
    "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
}


def stdio_marker_config(directory: Path, server: str, entry_extra: dict) -> tuple[Path, Path]:
    """A configuration whose server ``server`` would touch a marker file if started."""
    marker = directory / f"{server}-started"
    entry = {"command": "/bin/sh", "args": ["-c", f"touch {marker}"], **entry_extra}
    return write_json(directory / f"{server}.mcp.json", {"mcpServers": {server: entry}}), marker


# ------------------------------------------------- M-1: the workflow, literally as SPEC spells it


def test_m1_the_spec_workflow_projects_checks_and_installs_with_source(
    storage: Path, tmp_path: Path
) -> None:
    """M-1's two commands, then the design text's ``ctx object check OUT/S.T.manifest.json``
    and ``ctx object install --source STORAGE OUT/S.T.manifest.json --tier system``: an
    ordinary tool whose controls are the candidate's, granted to nobody (M-1 "grants no
    policy", T-8 "Installing grants no agent any permission"), under no root ``mcp/`` (R-2)."""
    config = time_config(tmp_path)
    out = tmp_path / "not" / "yet" / "made"  # --out: "made if missing"
    name = "time.get_current_time"

    done = project(config, "time", out, runtime="/workspace/.mcp.json")
    candidate = out / f"{name}.manifest.json"
    checked = ctx_run("object", "check", candidate)
    before = snapshot(storage)
    installed = ctx_run(
        "object", "install", "--source", storage, candidate, "--tier", "system",
        env=clean_env(),
    )  # fmt: skip

    assert done.returncode == 0, done
    assert checked.rc == 0, checked
    assert installed.rc == 0, installed
    manifest = json.loads(candidate.read_text())
    executable = storage / "tool" / name
    controls = storage / "tool" / f"{name}.d"
    assert executable.is_file() and os.access(executable, os.X_OK)
    for control in TOOL_CONTROLS:
        assert (controls / control).exists(), control
    assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
    assert (controls / "name").read_text().strip() == name
    assert json.loads((controls / "schema").read_text()) == manifest["schema"]
    assert json.loads((controls / "mcp").read_text()) == {
        "transport": "stdio",
        "config": "/workspace/.mcp.json",
        "server": "time",
        "tool": "get_current_time",
    }
    rules = [
        line
        for line in (controls / "policy").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert rules == [], rules  # installing granted nothing
    assert not (controls / "program").exists()  # C-2: never inferred, so missing (fine)
    assert set(os.listdir(storage)) == ROOT_ENTRIES  # no mcp/
    after = snapshot(storage)
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    # the install made the tool and its controls, and touched no policy of any agent
    assert all(
        path.split("/")[:2] in (["tool", name], ["tool", f"{name}.d"]) for path in changed
    ), changed
    env = clean_env(CTX_STORAGE=str(storage))
    assert listed_status(env, name) == "available"
    which = ctx_run("object", "which", name, env=clean_env(CTX_PATH=str(storage / "tool")))
    assert which.rc == 0 and which.out.strip() == str(executable), which


def test_m1_a_stdio_entry_that_says_type_stdio_is_projected(tmp_path: Path) -> None:
    """M-1 projects "external **stdio** servers": an entry that names its transport
    ``"type": "stdio"`` (as MCP client configurations do) is one."""
    config, _ = scripted_config(tmp_path, tools=[ECHO])
    servers = json.loads(config.read_text())
    servers["mcpServers"]["fake"]["type"] = "stdio"
    write_json(config, servers)
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "fake")
    done = project(config, "fake", out)

    assert listed.returncode == 0 and "fake.echo" in listed.stdout, listed
    assert done.returncode == 0, done
    assert json.loads((out / "fake.echo.manifest.json").read_text())["mcp"]["transport"] == "stdio"


@pytest.mark.parametrize(
    "extra",
    [
        {"url": "http://127.0.0.1:9/mcp"},
        {"type": "sse"},
        {"type": "http"},
        {"type": "stdio", "url": "http://127.0.0.1:9/mcp"},
    ],
    ids=["command-and-url", "type-sse", "type-http", "stdio-and-url"],
)
def test_m1_an_entry_that_is_not_plainly_stdio_is_refused_and_never_started(
    tmp_path: Path, extra: dict
) -> None:
    """M-1: only stdio servers; an entry that also names another transport is not plainly
    one, so neither command starts it, and the refusal is a usage error naming EINVAL."""
    config, marker = stdio_marker_config(tmp_path, "mixed", extra)
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "mixed")
    done = project(config, "mixed", out)

    for refused in (listed, done):
        assert refused.returncode == 2, refused
        assert "EINVAL" in refused.stderr and "stdio" in refused.stderr, refused
    assert not marker.exists()
    assert not out.exists()


USAGE_ERRORS = [
    ("list", "--server", "fake"),  # no --config
    ("list", "--config", "@config"),  # no --server
    ("project", "--config", "@config", "--server", "fake", "--out", "@out"),  # no runtime
    ("project", "--config", "@config", "--server", "fake", "--runtime-config", RUNTIME_CONFIG),
    ("list", "--config", "@config", "--server", "fake", "--timeout", "0"),
    ("list", "--config", "@config", "--server", "fake", "--timeout", "-1"),
    ("list", "--config", "@config", "--server", "fake", "--timeout", "nan"),
    ("list", "--config", "@config", "--server", "fake", "--timeout", "inf"),
    ("list", "--config", "@config", "--server", "fake", "--timeout", "soon"),
    ("list", "--config", "@missing", "--server", "fake"),
    ("list", "--config", "@config", "--server", "absent"),
    ("list", "--config", "@config", "--server", "fake", "--bogus"),
    ("install", "--config", "@config", "--server", "fake"),  # no such subcommand
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=lambda argv: " ".join(argv))
def test_m1_a_command_line_ctxmcp_cannot_use_is_exit_2_and_starts_no_server(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """``ctxmcp --help``: "2 usage error"; CONVENTIONS: every bad input gets an errno word.
    Nothing is started: the server records no message."""
    config, record = scripted_config(tmp_path, tools=[ECHO])
    places = {"@config": config, "@missing": tmp_path / "missing.json", "@out": tmp_path / "out"}

    refused = ctxmcp(*(places.get(arg, arg) for arg in argv))

    assert refused.returncode == 2, refused
    assert refused.stderr.strip().splitlines()[-1].startswith("ctxmcp: E"), refused.stderr
    assert "Traceback" not in refused.stderr
    assert not received(record)
    assert not (tmp_path / "out").exists()


def test_m1_an_out_that_is_a_file_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    config, record = scripted_config(tmp_path, tools=[ECHO])
    out = tmp_path / "out"
    out.write_text("mine\n")

    refused = project(config, "fake", out)

    assert refused.returncode == 2, refused
    assert "EINVAL" in refused.stderr or "ENOTDIR" in refused.stderr, refused
    assert out.read_text() == "mine\n"
    assert not received(record)


def test_m1_out_in_the_default_storage_root_is_refused_with_no_setting_at_all(
    tmp_path: Path,
) -> None:
    """M-1 "writes nothing under /ctx", which shows the storage root; R-1: without
    ``CTX_STORAGE`` or ``--storage`` that root is the system default
    ``/var/lib/cortexfs/storage/current`` (for root) or
    ``$XDG_DATA_HOME/cortexfs/storage/current`` (for another user) — whether or not it
    exists yet, an OUT there is refused and nothing is made."""
    env = clean_env(XDG_DATA_HOME=str(tmp_path / "xdg"))
    if os.geteuid() == 0:
        default = Path("/var/lib/cortexfs/storage/current")
    else:
        default = tmp_path / "xdg" / "cortexfs" / "storage" / "current"
    outs = [default / "tool" / "candidates", default / "mcp"]
    if any(os.path.lexists(out) for out in outs):
        pytest.skip("the default storage root already holds one of the places tried")
    # The default root may be in use by others on this machine: look only at what the
    # refused commands could have made, OUT and every directory on its way.
    ways = [p for out in outs for p in [out, *out.parents] if not os.path.lexists(p)]
    config, record = scripted_config(tmp_path, tools=[ECHO])

    for out in outs:
        refused = ctxmcp(
            "project", "--config", config, "--runtime-config", RUNTIME_CONFIG,
            "--server", "fake", "--out", out, env=env,
        )  # fmt: skip

        assert refused.returncode == 2, refused
        assert "EINVAL" in refused.stderr, refused
        assert not [p for p in ways if os.path.lexists(p)], out
    assert not received(record)


def test_m1_list_json_reports_each_tool_and_why_one_would_be_skipped(tmp_path: Path) -> None:
    """``ctxmcp list``: "List SERVER's tools with the name each would be projected as, or why
    it would not" — in ``--json`` too, with exit 0 (listing skips nothing)."""
    tools = [ECHO, {**ECHO, "name": "has space"}]
    config, _ = scripted_config(tmp_path, tools=tools)

    listed = ctxmcp("list", "--config", config, "--server", "fake", "--json")

    assert listed.returncode == 0, listed
    report = json.loads(listed.stdout)
    assert report["server"] == "fake"
    assert report["protocolVersion"] == "2025-11-25"
    by_tool = {entry["tool"]: entry for entry in report["tools"]}
    assert set(by_tool) == {"echo", "has space"}
    assert by_tool["echo"]["name"] == "fake.echo" and not by_tool["echo"]["problem"]
    assert by_tool["has space"]["problem"], by_tool["has space"]
    assert by_tool["has space"]["name"] in (None, "")


def test_m1_project_json_shape_and_exit_1_when_a_tool_is_skipped(tmp_path: Path) -> None:
    """``ctxmcp --help``: "1 … 'project' skipped a tool"; ``project --help``: the others are
    written; each skip is reported (M-3)."""
    tools = [ECHO, {**ECHO, "name": "a/b"}]
    config, _ = scripted_config(tmp_path, tools=tools)
    out = tmp_path / "out"

    done = project(config, "fake", out, "--json")

    assert done.returncode == 1, done
    report = json.loads(done.stdout)
    assert {"server", "protocolVersion", "written", "replaced", "skipped", "notes"} <= set(report)
    assert [Path(p).name for p in report["written"]] == ["fake.echo.manifest.json"]
    assert report["replaced"] == []
    assert [entry["tool"] for entry in report["skipped"]] == ["a/b"]
    assert report["skipped"][0]["problem"]
    # reported: in --json mode the report is the skipped list above, stderr in text mode
    as_text = project(config, "fake", tmp_path / "again")
    assert as_text.returncode == 1 and "a/b" in as_text.stderr, as_text
    assert sorted(os.listdir(out)) == ["fake.echo.manifest.json"]


def test_m1_a_tool_without_a_description_still_makes_a_valid_candidate(tmp_path: Path) -> None:
    """MCP makes a tool's description optional, T-8 makes a manifest's required: M-1's
    candidates are v2 manifests, so ``ctx object check`` accepts the one written."""
    config, _ = scripted_config(
        tmp_path, tools=[{"name": "bare", "inputSchema": {"type": "object"}}]
    )
    out = tmp_path / "out"

    done = project(config, "fake", out)

    assert done.returncode == 0, done
    candidate = out / "fake.bare.manifest.json"
    assert json.loads(candidate.read_text())["description"].strip()
    checked = ctx_run("object", "check", candidate)
    assert checked.rc == 0, checked


def test_m1_a_full_standard_output_is_exit_74_and_the_candidates_stay(tmp_path: Path) -> None:
    """``ctxmcp --help``: "74 the output could not be written (the candidates 'project'
    wrote stay written)"."""
    config, _ = scripted_config(tmp_path, tools=[ECHO])
    out = tmp_path / "out"
    argv = [str(CTXMCP), "project", "--config", str(config), "--runtime-config",
            RUNTIME_CONFIG, "--server", "fake", "--out", str(out)]  # fmt: skip
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            argv, stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env(), timeout=90
        )

    assert done.returncode == 74, done.stderr
    assert "ENOSPC" in done.stderr
    assert ctx_run("object", "check", out / "fake.echo.manifest.json").rc == 0


# ------------------------------------------------------------------------------ M-2: versions


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_m2_list_refuses_a_future_version_with_eproto_and_exit_1(tmp_path, json_flag) -> None:
    """M-2 "draft, unknown or future versions are refused"; ``ctxmcp --help``: exit 1 when
    the server "was refused"."""
    config, record = scripted_config(tmp_path, version="2099-01-01", tools=[ECHO])

    refused = ctxmcp("list", "--config", config, "--server", "fake", *json_flag)

    assert refused.returncode == 1, refused
    assert "EPROTO" in refused.stderr and "2099-01-01" in refused.stderr, refused
    assert "fake.echo" not in refused.stdout
    if json_flag and refused.stdout.strip():
        assert "tools" not in json.loads(refused.stdout)  # no listing of a refused session
    assert "tools/list" not in {m.get("method") for m in received(record)}


# ---------------------------------------------------------------------------------- M-3: names


def test_m3_a_server_name_that_cannot_start_an_object_name_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    """M-3: every projected name ``_x.<tool>`` would break R-3 ("first byte
    [A-Za-z0-9]"): nothing could be projected, so the server is not even started."""
    config, record = scripted_config(tmp_path, "_x", tools=[ECHO])
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "_x")
    done = project(config, "_x", out)

    for refused in (listed, done):
        assert refused.returncode == 2, refused
        assert "EINVAL" in refused.stderr, refused
    assert not received(record)
    assert not out.exists()


# ------------------------------------------------------------------------- M-4 and C-1, C-2


def test_c1_a_servers_output_schema_becomes_neither_schema_nor_program(tmp_path: Path) -> None:
    """C-1: CortexFS "never treats ``schema`` as an output schema"; C-2: ``program`` is "the
    author's … declaration" (the design text: it cannot be inferred, and availability is
    never inferred from an MCP source).  A remote tool with an ``outputSchema`` and every
    read-only, idempotent, closed-world annotation projects to its *input* schema and a
    manifest of exactly the T-8 fields: no program, no output schema, no allowed callers."""
    config, _ = scripted_config(tmp_path, "calc", tools=[ADD])
    out = tmp_path / "out"

    done = project(config, "calc", out, "--json")

    assert done.returncode == 0, done
    text = (out / "calc.add.manifest.json").read_text()
    manifest = json.loads(text)
    assert set(manifest) == CANDIDATE_FIELDS, manifest
    assert manifest["schema"] == ADD["inputSchema"]
    for word in ("outputSchema", "output_schema", "allowed_callers", "programmatic", "program"):
        assert word not in text, word
    assert isinstance(manifest["cap"]["side_effects"], bool)
    assert isinstance(manifest["cap"]["network"], bool)


def test_c1_ctxmcp_announces_nothing_of_programmatic_tool_calling(tmp_path: Path) -> None:
    """C-1: "CortexFS does not announce a programmatic_tool_calling tool or allowed_callers":
    not in what ctxmcp sends a server either."""
    config, record = scripted_config(tmp_path, tools=[ECHO])

    assert ctxmcp("list", "--config", config, "--server", "fake").returncode == 0
    assert project(config, "fake", tmp_path / "out").returncode == 0

    sent = record.read_text()
    assert sent.count('"initialize"') == 2
    for word in ("programmatic", "allowed_callers", "output_schema", "outputSchema"):
        assert word not in sent, word


def test_c2_an_mcp_backed_manifest_may_carry_an_authors_program(
    storage: Path, tmp_path: Path
) -> None:
    """T-8 ``"exec" | "mcp", "program"?``; C-2: a valid program is installed as the
    ``program`` control and the tool stays available; it grants nothing."""
    env = clean_env(CTX_STORAGE=str(storage))
    locator = {"transport": "stdio", "config": "/mcp/mcp.json", "server": "s", "tool": "t"}
    manifest = mcp_manifest(tmp_path, locator, program=PROGRAM)

    checked = ctx_run("object", "check", manifest)
    installed = ctx_run("object", "install", manifest, "--tier", "system", env=env)

    assert checked.rc == 0, checked
    assert installed.rc == 0, installed
    controls = storage / "tool" / "s.t.d"
    assert json.loads((controls / "program").read_text()) == PROGRAM
    assert listed_status(env, "s.t") == "available"
    assert "allow" not in "".join(
        line for line in (controls / "policy").read_text().splitlines() if not line.startswith("#")
    )


@pytest.mark.parametrize("program", [[], "object", {"type": "nope"}], ids=repr)
def test_c2_a_malformed_program_of_an_mcp_backed_manifest_leaves_no_available_tool(
    storage: Path, tmp_path: Path, program: object
) -> None:
    """C-2: "malformed, non-object, or failing schema validation makes the tool
    unavailable", for a projected tool as for any other."""
    env = clean_env(CTX_STORAGE=str(storage))
    locator = {"transport": "stdio", "config": "/mcp/mcp.json", "server": "s", "tool": "t"}
    manifest = mcp_manifest(tmp_path, locator, program=program)

    checked = ctx_run("object", "check", manifest)
    ctx_run("object", "install", manifest, "--tier", "system", env=env)

    assert checked.rc == 1 and "program" in checked.err, checked
    assert listed_status(env, "s.t") in (None, "unavailable", "damaged")
