"""Acceptance tests of §10 (``ctxmcp``: M-1 … M-4) and §11 (programmatic tool calling
reserved: C-1, C-2), run against the installed ``ctxmcp`` and ``ctx``.

The servers are real stdio MCP servers: the published ``mcp-server-time`` and a server built
on the published MCP SDK (both from PyPI, in the project's dev dependencies), and, for what no
published server does on request (answer with a draft, an unknown or a future protocol
version), a small scripted server written here.  Nothing of the product is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import REPO, ROOT_ENTRIES, clean_env, ctx_run, snapshot

CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
SECRET = "tok-4f1c9e-never-copied"
RUNTIME_CONFIG = "/mcp/mcp.json"
TIME_TOOLS = {"time.get_current_time", "time.convert_time"}
STABLE_VERSIONS = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs tools as another uid")

# A stdio MCP server that answers initialize with the version its script names (or echoes
# the client's), serves the script's tools, and records every message it receives.
SCRIPTED_SERVER = r"""
import json, sys
script = json.load(open(sys.argv[1]))
for line in sys.stdin:
    message = json.loads(line)
    with open(script["record"], "a") as record:
        record.write(json.dumps(message) + "\n")
    if "id" not in message:
        continue
    method, params = message["method"], message.get("params", {})
    if method == "initialize":
        result = {"protocolVersion": script.get("version", params.get("protocolVersion")),
                  "capabilities": {"tools": {}},
                  "serverInfo": {"name": "scripted", "version": "1"}}
        if "version" in script and script["version"] is None:
            del result["protocolVersion"]
    elif method == "tools/list":
        result = {"tools": script.get("tools", [])}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": json.dumps(params.get("arguments"))}],
                  "isError": False}
    else:
        reply = {"jsonrpc": "2.0", "id": message["id"],
                 "error": {"code": -32601, "message": "no method " + method}}
        print(json.dumps(reply), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""

# A server of the MCP SDK offering one tool under each name given on its command line.
SDK_SERVER = r"""
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("names", subscriptions=False)
for name in sys.argv[1:]:
    def echo(text: str = "") -> str:
        return text
    server.add_tool(echo, name=name, description="the tool " + name)
server.run("stdio")
"""


def ctxmcp(
    *args: str | os.PathLike, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CTXMCP), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=90,
        env=env if env is not None else clean_env(),
    )


def write_json(path: Path, value: object, mode: int = 0o644) -> Path:
    path.write_text(json.dumps(value))
    path.chmod(mode)
    return path


def time_config(directory: Path) -> Path:
    """A client configuration whose server ``time`` is the published time server, holding a
    secret in its environment and in its arguments, as real configurations do."""
    entry = {
        "command": str(TIME_SERVER),
        "args": ["--local-timezone", "Etc/UTC"],
        "env": {"API_TOKEN": SECRET},
    }
    return write_json(directory / "mcp.json", {"mcpServers": {"time": entry}})


def scripted_config(directory: Path, server: str = "fake", **script) -> tuple[Path, Path]:
    """A configuration whose server ``server`` follows ``script``; returns it and the file
    the server records each message it receives in."""
    (directory / "scripted_server.py").write_text(SCRIPTED_SERVER)
    record = directory / "received.jsonl"
    script["record"] = str(record)
    script_path = write_json(directory / "script.json", script)
    entry = {
        "command": sys.executable,
        "args": [str(directory / "scripted_server.py"), str(script_path)],
    }
    return write_json(directory / "fake.mcp.json", {"mcpServers": {server: entry}}), record


def sdk_config(directory: Path, *names: str) -> Path:
    """A configuration whose server ``s`` (the MCP SDK's) offers a tool under each name."""
    (directory / "sdk_server.py").write_text(SDK_SERVER)
    entry = {"command": str(VENV_PYTHON), "args": [str(directory / "sdk_server.py"), *names]}
    return write_json(directory / "sdk.mcp.json", {"mcpServers": {"s": entry}})


def received(record: Path) -> list[dict]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def project(config: Path, server: str, out: Path, *extra: str, runtime: str = RUNTIME_CONFIG):
    return ctxmcp(
        "project", "--config", config, "--runtime-config", runtime,
        "--server", server, "--out", out, *extra,
    )  # fmt: skip


def files_under(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------- M-1: list and project


@dataclass
class TimeProjection:
    """``ctxmcp list --json`` and ``ctxmcp project`` of the published time server, run once
    with ``--storage`` and ``$CTX_STORAGE`` naming a bootstrapped root."""

    config: Path
    listed_text: subprocess.CompletedProcess
    listed_json: subprocess.CompletedProcess
    projected: subprocess.CompletedProcess
    out: Path
    storage: Path
    before: dict
    after: dict


@pytest.fixture(scope="module")
def time_projection(tmp_path_factory: pytest.TempPathFactory) -> TimeProjection:
    top = tmp_path_factory.mktemp("time")
    storage = top / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    env = clean_env(CTX_STORAGE=str(storage))
    before = snapshot(storage)
    config = time_config(top)
    listed_text = ctxmcp("list", "--config", config, "--server", "time", env=env)
    listed_json = ctxmcp("list", "--config", config, "--server", "time", "--json", env=env)
    out = top / "candidates"
    projected = ctxmcp(
        "project", "--config", config, "--runtime-config", RUNTIME_CONFIG,
        "--server", "time", "--out", out, "--storage", storage, "--json", env=env,
    )  # fmt: skip
    after = snapshot(storage)
    return TimeProjection(config, listed_text, listed_json, projected, out, storage, before, after)


def test_m1_list_names_each_tool_of_a_real_stdio_server(time_projection) -> None:
    listed = time_projection.listed_text

    assert listed.returncode == 0, listed
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert names >= TIME_TOOLS, listed.stdout


def test_m1_project_writes_v2_manifest_candidates_that_object_check_accepts(time_projection):
    out = time_projection.out

    assert time_projection.projected.returncode == 0, time_projection.projected
    written = {p.name for p in out.iterdir()}
    assert written == {f"{name}.manifest.json" for name in TIME_TOOLS}
    for name in TIME_TOOLS:
        manifest = json.loads((out / f"{name}.manifest.json").read_text())
        # T-8: {"manifest": 2, "kind": "tool", "name", "description", "schema", "cap", "mcp"}
        assert manifest["manifest"] == 2 and manifest["kind"] == "tool"
        assert manifest["name"] == name
        assert isinstance(manifest["schema"], dict) and isinstance(manifest["cap"], dict)
        assert manifest["description"].strip()
        assert "exec" not in manifest
    checked = ctx_run("object", "check", *sorted(out.iterdir()))
    assert checked.rc == 0, checked


def test_m1_project_installs_nothing_and_writes_nothing_in_the_storage_root(time_projection):
    """M-1: "it installs nothing, grants no policy, writes nothing under /ctx"."""
    storage = time_projection.storage

    assert time_projection.projected.returncode == 0, time_projection.projected
    assert time_projection.after == time_projection.before
    assert set(os.listdir(storage)) == ROOT_ENTRIES  # no mcp/, no registry
    listed = ctx_run("object", "list", "--json", env=clean_env(CTX_STORAGE=str(storage)))
    assert listed.rc == 0, listed
    assert not [t for t in json.loads(listed.out) if t["name"].startswith("time.")]


def test_m1_project_into_the_storage_root_is_refused_and_makes_nothing(storage, tmp_path):
    """M-1: ctxmcp "writes nothing under /ctx" — /ctx shows the storage root."""
    before = snapshot(storage)
    env = clean_env(CTX_STORAGE=str(storage))
    for out in (storage / "tool", storage / "tool" / "candidates", storage / "mcp"):
        done = ctxmcp(
            "project", "--config", time_config(tmp_path), "--runtime-config", RUNTIME_CONFIG,
            "--server", "time", "--out", out, "--storage", storage, env=env,
        )  # fmt: skip
        assert done.returncode != 0, done
        assert done.stderr.strip()
        assert snapshot(storage) == before, out


def test_m1_a_link_into_the_storage_root_is_no_way_in(storage, tmp_path: Path) -> None:
    before = snapshot(storage)
    (tmp_path / "to-tool").symlink_to(storage / "tool")
    (tmp_path / "to-root").symlink_to(storage)
    config, _ = scripted_config(tmp_path, tools=[])
    for out in (tmp_path / "to-tool", tmp_path / "to-root" / "shared" / "candidates"):
        done = project(config, "fake", out, "--storage", str(storage))
        assert done.returncode != 0, done
        assert snapshot(storage) == before, out


def test_m1_project_never_writes_under_slash_ctx(tmp_path: Path) -> None:
    """M-1: "writes nothing under /ctx", even where nothing is mounted there yet."""
    if os.path.lexists("/ctx"):
        pytest.skip("/ctx exists on this machine")
    try:
        done = project(time_config(tmp_path), "time", Path("/ctx/tool/candidates"))
        assert done.returncode != 0, done
        assert not os.path.lexists("/ctx")
    finally:
        if os.path.lexists("/ctx") and not os.path.ismount("/ctx"):
            shutil.rmtree("/ctx")


def test_m1_only_the_chosen_server_is_started(tmp_path: Path) -> None:
    """M-1: "explicitly chosen external stdio servers": the other servers of the
    configuration are never started."""
    marker = tmp_path / "other-started"
    tool = {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}
    config, _ = scripted_config(tmp_path, tools=[tool])
    servers = json.loads(config.read_text())
    servers["mcpServers"]["other"] = {"command": "/bin/sh", "args": ["-c", f"touch {marker}"]}
    write_json(config, servers)

    listed = ctxmcp("list", "--config", config, "--server", "fake")
    done = project(config, "fake", tmp_path / "out")

    assert listed.returncode == 0 and done.returncode == 0, (listed, done)
    assert not marker.exists()


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "http", "url": "http://127.0.0.1:9/mcp"},
        {"url": "http://127.0.0.1:9/sse"},
        {"type": "sse", "url": "http://127.0.0.1:9/sse"},
    ],
    ids=["http", "url", "sse"],
)
def test_m1_a_server_that_is_not_stdio_is_refused(tmp_path: Path, entry: dict) -> None:
    """M-1: only "external **stdio** servers" are projected."""
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {"remote": entry}})

    listed = ctxmcp("list", "--config", config, "--server", "remote")
    done = project(config, "remote", tmp_path / "out")

    assert listed.returncode != 0 and done.returncode != 0, (listed, done)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_m1_a_server_missing_from_the_configuration_is_refused(tmp_path: Path) -> None:
    listed = ctxmcp("list", "--config", time_config(tmp_path), "--server", "github")

    assert listed.returncode != 0
    assert "github" in listed.stderr


# ------------------------------------------------------------------------- M-2: versions


def test_m2_announces_protocol_version_2025_11_25(tmp_path: Path) -> None:
    config, record = scripted_config(tmp_path, tools=[])

    listed = ctxmcp("list", "--config", config, "--server", "fake")

    assert listed.returncode == 0, listed
    initialize = [m for m in received(record) if m.get("method") == "initialize"]
    assert len(initialize) == 1
    assert initialize[0]["params"]["protocolVersion"] == "2025-11-25"


@pytest.mark.parametrize("version", STABLE_VERSIONS)
def test_m2_each_stable_version_the_server_negotiates_is_accepted(tmp_path, version):
    tool = {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}
    config, _ = scripted_config(tmp_path, version=version, tools=[tool])
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "fake")
    done = project(config, "fake", out)

    assert listed.returncode == 0, listed
    assert "fake.echo" in listed.stdout
    assert done.returncode == 0, done
    assert (out / "fake.echo.manifest.json").is_file()


@pytest.mark.parametrize(
    "version",
    [
        "2026-07-28",  # a later revision than the four (future)
        "2099-01-01",  # future
        "DRAFT-2026-v1",  # a draft
        "2025-11-25-draft",
        "2024-10-07",  # an unknown (older) revision
        " 2025-11-25",  # not exactly a stable version
        "2025-11-25\n",
        "1.0",
        "",
        None,  # none at all
        20251125,  # not a string
    ],
)
def test_m2_a_draft_unknown_or_future_version_is_refused(tmp_path, version) -> None:
    tool = {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}
    config, record = scripted_config(tmp_path, version=version, tools=[tool])
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "fake")
    done = project(config, "fake", out)

    assert listed.returncode != 0, listed
    assert "fake.echo" not in listed.stdout
    assert listed.stderr.strip()
    assert done.returncode != 0, done
    assert not out.exists() or not os.listdir(out)
    # refused: the session goes no further than the handshake
    methods = {m.get("method") for m in received(record)}
    assert "tools/list" not in methods and "tools/call" not in methods, methods


def test_m2_a_real_server_negotiates_an_accepted_version(time_projection) -> None:
    """The published server speaks a newer revision too (2026-07-28); the session must still
    settle on one of the four."""
    listed = time_projection.listed_json

    assert listed.returncode == 0, listed
    assert "2026-07-28" not in listed.stdout
    assert any(version in listed.stdout for version in STABLE_VERSIONS), listed.stdout


# -------------------------------------------------------------------------- M-3: names


def test_m3_projected_names_are_exactly_server_dot_tool(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = sdk_config(tmp_path, "search_issues", "create-issue", "get.file")

    done = project(config, "s", out)

    assert done.returncode == 0, done
    expected = {"s.search_issues", "s.create-issue", "s.get.file"}
    assert {p.name for p in out.iterdir()} == {f"{n}.manifest.json" for n in expected}
    for name in expected:
        manifest = json.loads((out / f"{name}.manifest.json").read_text())
        assert manifest["name"] == name  # no implicit "mcp." prefix
        assert manifest["mcp"]["server"] == "s"
        assert manifest["mcp"]["tool"] == name[len("s.") :]


def test_m3_a_tool_whose_projected_name_is_illegal_is_reported_and_skipped(tmp_path):
    longest = "y" * 62  # "s." + 62 bytes = 64 bytes: the longest legal object name
    too_long = "x" * 63  # 65 bytes
    illegal = ["bad name", too_long, "ends.d", "a/b", "caf\u00e9"]
    tools = [
        {"name": name, "description": name, "inputSchema": {"type": "object"}}
        for name in ("ok", longest, *illegal)
    ]
    config, _ = scripted_config(tmp_path, "s", tools=tools)
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "s")
    done = project(config, "s", out)

    assert {p.name for p in out.iterdir()} == {"s.ok.manifest.json", f"s.{longest}.manifest.json"}
    for name in illegal:
        assert name in done.stderr, (name, done.stderr)  # reported
        assert name in listed.stdout + listed.stderr, (name, listed)
    legal_lines = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert {"s.ok", f"s.{longest}"} <= legal_lines
    assert not {f"s.{name}" for name in illegal} & legal_lines


def test_m3_project_keeps_no_registry_beside_the_candidates(time_projection) -> None:
    """M-3: "no registry": OUT holds the candidates and nothing else."""
    assert time_projection.projected.returncode == 0, time_projection.projected

    assert files_under(time_projection.out).keys() == {f"{n}.manifest.json" for n in TIME_TOOLS}


# ------------------------------------------------------------------------- M-4: locator


def test_m4_the_mcp_locator_is_transport_config_server_and_tool(time_projection) -> None:
    out = time_projection.out
    manifest = json.loads((out / "time.get_current_time.manifest.json").read_text())

    assert manifest["mcp"] == {
        "transport": "stdio",
        "config": RUNTIME_CONFIG,
        "server": "time",
        "tool": "get_current_time",
    }


@pytest.mark.parametrize("runtime", ["mcp.json", "./mcp.json", "workspace/.mcp.json", ""])
def test_m4_a_config_path_that_is_not_absolute_is_refused(tmp_path, runtime) -> None:
    """M-4: the locator holds "the visible absolute config path"."""
    out = tmp_path / "out"
    done = project(time_config(tmp_path), "time", out, runtime=runtime)

    assert done.returncode != 0, done
    assert not out.exists() or not os.listdir(out)


def test_m4_projection_never_copies_the_configuration_or_its_secrets(time_projection):
    done = time_projection.projected

    assert done.returncode == 0, done
    for name, text in files_under(time_projection.out).items():
        assert SECRET.encode() not in text, name
        assert str(TIME_SERVER).encode() not in text, name  # the command
        assert b"--local-timezone" not in text, name  # its arguments
        assert b"API_TOKEN" not in text, name
        manifest = json.loads(text)
        assert "env" not in manifest and "command" not in manifest and "args" not in manifest
    assert SECRET not in done.stdout + done.stderr


def mcp_manifest(directory: Path, locator: dict, name: str = "s.t", **extra) -> Path:
    manifest = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": "a projected tool",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": True},
        "mcp": locator,
        **extra,
    }
    return write_json(directory / f"{name}.{len(os.listdir(directory))}.json", manifest)


LOCATOR = {"transport": "stdio", "config": "/mcp/mcp.json", "server": "s", "tool": "t"}


@pytest.mark.parametrize(
    "locator",
    [
        {**LOCATOR, "env": {"API_TOKEN": SECRET}},  # a copied secret
        {**LOCATOR, "command": "/usr/bin/server"},  # a copied command
        {**LOCATOR, "transport": "http"},
        {**LOCATOR, "transport": "sse"},
        {**LOCATOR, "config": "mcp.json"},  # not absolute
        {**LOCATOR, "config": "https://example.org/mcp.json"},
        {k: v for k, v in LOCATOR.items() if k != "transport"},
        {k: v for k, v in LOCATOR.items() if k != "config"},
        {k: v for k, v in LOCATOR.items() if k != "server"},
        {k: v for k, v in LOCATOR.items() if k != "tool"},
        {**LOCATOR, "tool": "u"},  # the name is not <server>.<tool>
        {**LOCATOR, "server": "x"},
        {**LOCATOR, "server": 1},
        "stdio:/mcp/mcp.json#s/t",
        [],
    ],
    ids=repr,
)
def test_m4_the_mcp_locator_is_strict(tmp_path: Path, locator) -> None:
    """M-4: "a strict stdio locator with transport, the visible absolute config path,
    server and tool"; M-3: the name is exactly <server>.<tool>."""
    assert ctx_run("object", "check", mcp_manifest(tmp_path, LOCATOR)).rc == 0

    checked = ctx_run("object", "check", mcp_manifest(tmp_path, locator))

    assert checked.rc == 1, checked
    assert "EINVAL" in checked.err


def test_m4_a_manifest_with_both_exec_and_mcp_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.sh").write_text("#!/bin/sh\n")
    checked = ctx_run("object", "check", mcp_manifest(tmp_path, LOCATOR, exec="t.sh"))

    assert checked.rc == 1 and "EINVAL" in checked.err, checked


@pytest.fixture
def host() -> Iterator[Path]:
    """A directory every uid may search, holding a bootstrapped storage root and the host's
    MCP configuration directory ``mcp/``, which agents see read-only at ``/mcp``."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-mcp-", dir="/tmp"))
    top.chmod(0o755)
    try:
        assert ctx_run("bootstrap", "--storage", top / "storage").rc == 0
        (top / "mcp").mkdir(mode=0o755)
        yield top
    finally:
        shutil.rmtree(top)


def make_agent(top: Path, tools: list[str]) -> dict[str, str]:
    """Agent ``coder`` (label coder_t) allowed ``tools`` in its own policy; returns the env."""
    env = clean_env(CTX_STORAGE=str(top / "storage"))
    request = {
        "name": "coder",
        "label": "coder_t",
        "tools": tools,
        "mount": [[str(top / "mcp"), "/mcp", "ro"]],
    }
    made = ctx_run("agent", "create", write_json(top / "coder.json", request), env=env)
    assert made.rc == 0, made
    return env


def install(manifest: Path, env: dict[str, str]) -> None:
    done = ctx_run("object", "install", manifest, "--tier", "system", env=env)
    assert done.rc == 0, done


def allow_in_tool_policy(storage: Path, name: str) -> None:
    with (storage / "tool" / f"{name}.d" / "policy").open("a") as policy:
        policy.write(f"allow coder_t tool:{name} execute\n")


def run_native(env: dict[str, str], name: str, tool_input: dict) -> tuple[object, dict]:
    ran = ctx_run("run", "--agent", "coder", "--native", name, input=json.dumps(tool_input),
                  env=env)  # fmt: skip
    frames = [json.loads(line) for line in ran.lines()]
    assert frames and frames[-1]["type"] == "result", ran
    return ran, frames[-1]


@needs_root
def test_m4_an_installed_projection_is_an_ordinary_tool_under_the_tool_policy_class(
    host, time_projection
):
    """M-4: "Projected tools use the ordinary tool ABI and the same policy class
    (allow coder_t tool:github.search_issues execute)"; M-1: projecting grants no policy."""
    storage = host / "storage"
    name = "time.get_current_time"
    time_config(host / "mcp")  # where the candidate's locator says agents see it: /mcp
    env = make_agent(host, [name])
    install(time_projection.out / f"{name}.manifest.json", env)

    controls = storage / "tool" / f"{name}.d"
    assert os.access(storage / "tool" / name, os.X_OK)
    for control in ("name", "description", "schema", "cap", "policy", "status", "log"):
        assert (controls / control).exists(), control
    assert json.loads((controls / "mcp").read_text()) == {
        "transport": "stdio",
        "config": RUNTIME_CONFIG,
        "server": "time",
        "tool": "get_current_time",
    }
    assert set(os.listdir(storage)) == ROOT_ENTRIES  # no /ctx/mcp

    # installed, it is still granted to nobody: the tool's own policy says nothing yet
    refused, result = run_native(env, name, {"timezone": "Etc/UTC"})
    assert refused.rc != 0 and result["status"] != "ok", refused
    assert "EACCES" in json.dumps(result), result

    allow_in_tool_policy(storage, name)
    ran, result = run_native(env, name, {"timezone": "Etc/UTC"})
    assert ran.rc == 0 and result["status"] == "ok", ran
    assert "Etc/UTC" in json.dumps(result["output"])
    # neither the install nor the calls and their records copied the configuration's secret
    for path, text in files_under(storage).items():
        assert SECRET.encode() not in text, path


@needs_root
@pytest.mark.parametrize("version", ["2024-11-05", "2026-07-28", "DRAFT-2026-v1"])
def test_m2_an_installed_projection_accepts_only_the_stable_versions_too(host, version):
    """M-2 holds for every session with a projected tool's server: the installed tool
    announces 2025-11-25 and refuses a draft or future answer before calling the tool."""
    storage = host / "storage"
    records = host / "records"
    records.mkdir(mode=0o777)
    records.chmod(0o777)  # the server runs as the agent's uid
    tool = {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}
    config, _ = scripted_config(host / "mcp", tools=[tool])
    for path in (host / "mcp").iterdir():
        path.chmod(0o644)
    out = host / "candidates"
    assert project(config, "fake", out, runtime="/mcp/fake.mcp.json").returncode == 0
    env = make_agent(host, ["fake.echo"])
    install(out / "fake.echo.manifest.json", env)
    allow_in_tool_policy(storage, "fake.echo")
    record = records / "received.jsonl"
    write_json(host / "mcp" / "script.json", {"version": version, "tools": [tool],
                                              "record": str(record)})  # fmt: skip

    ran, result = run_native(env, "fake.echo", {"text": "hi"})

    messages = received(record)
    assert messages, ran
    assert messages[0]["method"] == "initialize"
    assert messages[0]["params"]["protocolVersion"] == "2025-11-25"
    called = [m for m in messages if m.get("method") == "tools/call"]
    if version in STABLE_VERSIONS:
        assert ran.rc == 0 and result["status"] == "ok", ran
        assert len(called) == 1 and called[0]["params"]["arguments"] == {"text": "hi"}
    else:
        assert ran.rc != 0 and result["status"] != "ok", ran
        assert not called, messages


def installed_echo(host: Path) -> tuple[dict[str, str], Path, Path]:
    """A scripted server's tool ``echo`` projected, installed as ``fake.echo`` and granted to
    an agent in both policies: the agent's environment, the tool's ``mcp`` control, and the
    file the server records each message it receives in (none yet)."""
    storage = host / "storage"
    records = host / "records"
    records.mkdir()
    records.chmod(0o777)  # the server runs as the agent's uid
    tool = {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}}
    config, _ = scripted_config(host / "mcp", tools=[tool])
    record = records / "received.jsonl"
    write_json(host / "mcp" / "script.json", {"tools": [tool], "record": str(record)})
    out = host / "candidates"
    assert project(config, "fake", out, runtime="/mcp/fake.mcp.json").returncode == 0
    record.unlink()  # root's, from the projection; the agent's server makes its own
    env = make_agent(host, ["fake.echo"])
    install(out / "fake.echo.manifest.json", env)
    allow_in_tool_policy(storage, "fake.echo")
    return env, storage / "tool" / "fake.echo.d" / "mcp", record


@needs_root
def test_m4_a_control_that_is_not_a_strict_stdio_locator_starts_no_server(host) -> None:
    """M-4: the mcp control is "a strict stdio locator with transport, the visible absolute
    config path, server and tool" — an installed control holding anything else (a command, an
    environment, another transport, a relative path, a tool other than the name says) must
    not start a server."""
    env, control, record = installed_echo(host)
    good = json.loads(control.read_text())
    first = run_native(env, "fake.echo", {})
    assert first[0].rc == 0, first[0].out
    record.unlink()

    for bad in (
        {**good, "command": "/bin/sh"},
        {**good, "env": {"API_TOKEN": SECRET}},
        {**good, "transport": "http"},
        {**good, "config": "fake.mcp.json"},
        {**good, "tool": "fail"},
        {k: v for k, v in good.items() if k != "transport"},
        [good],
    ):
        write_json(control, bad)
        ran, result = run_native(env, "fake.echo", {})
        assert ran.rc != 0 and result["status"] != "ok", (bad, ran)
        assert not received(record), bad
        assert listed_status(env, "fake.echo") == "damaged", bad  # as a call finds it


@needs_root
def test_m4_a_control_that_names_a_key_twice_is_no_strict_locator(host) -> None:
    """M-4: a control that gives ``tool`` twice reads as one locator to a reader that keeps
    the first value and as another to one that keeps the last (Python's): whoever checks it
    may approve the tool the grant names while the bridge runs the other.  No strict locator
    is ambiguous, so the tool is damaged and no server starts."""
    env, control, record = installed_echo(host)
    good = json.loads(control.read_text())
    twice = json.dumps(good)[:-1] + ', "tool": "echo"}'
    control.write_text(twice.replace('"tool": "echo"', '"tool": "fail"', 1))

    ran, result = run_native(env, "fake.echo", {})

    assert ran.rc != 0 and result["status"] != "ok", ran
    assert not received(record)
    assert listed_status(env, "fake.echo") == "damaged"


def test_m4_the_policy_class_of_a_projected_tool_is_tool(tmp_path: Path) -> None:
    """P-3 has no mcp class: rules for projected tools are ordinary tool rules."""
    good = tmp_path / "good.policy"
    good.write_text("allow coder_t tool:github.search_issues execute\n")
    bad = tmp_path / "bad.policy"
    bad.write_text("allow coder_t mcp:github.search_issues execute\n")

    assert ctx_run("policy", "check", good).rc == 0
    checked = ctx_run("policy", "check", bad)
    assert checked.rc == 1 and "EINVAL" in checked.err, checked


# ---------------------------------------------------------------- §11: C-1 and C-2


LISTS_IT = """\
#!/bin/sh
# Prints what its input schema would refuse as an output: the schema is not an output schema.
cat >/dev/null
printf '[1, 2, 3]\\n'
"""


def tool_manifest(directory: Path, name: str, **extra: object) -> Path:
    """A v2 manifest of tool ``name`` with a strict input schema and no side effects."""
    (directory / f"{name}.sh").write_text(LISTS_IT)
    manifest = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} test tool.",
        "schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        "cap": {"side_effects": False, "network": False},
        "exec": f"{name}.sh",
        **extra,
    }
    return write_json(directory / f"{name}.json", manifest)


def listed_status(env: dict[str, str], name: str) -> str | None:
    listed = ctx_run("object", "list", "--json", env=env)
    assert listed.rc == 0, listed
    statuses = [t["status"] for t in json.loads(listed.out) if t["name"] == name]
    return statuses[0] if statuses else None


PROGRAM = {"type": "object", "additionalProperties": False}


@needs_root
def test_c1_no_programmatic_tool_calling_is_announced_and_schema_is_no_output_schema(host):
    """C-1: no ``programmatic_tool_calling`` tool, no ``allowed_callers``, schema never an
    output schema: a tool that passes every gate (a valid program, no side effects, allowed)
    is still called the single-call way, and an output its schema would refuse is its
    result."""
    storage = host / "storage"
    env = make_agent(host, ["demo.lists"])
    install(tool_manifest(host, "demo.lists", program=PROGRAM), env)
    allow_in_tool_policy(storage, "demo.lists")

    ran, result = run_native(env, "demo.lists", {"text": "hi"})

    assert ran.rc == 0 and result["status"] == "ok", ran
    assert "[1, 2, 3]" in json.dumps(result["output"]) or result["output"] == [1, 2, 3]
    assert not (storage / "tool" / "programmatic_tool_calling").exists()
    shown = ctx_run("agent", "show", "coder", "--json", env=env)
    listed = ctx_run("object", "list", "--json", env=env)
    texts = [ran.out, ran.err, shown.out, listed.out]
    texts += [t.decode("utf-8", "replace") for t in files_under(storage).values()]
    for text in texts:
        assert "programmatic_tool_calling" not in text
        assert "allowed_callers" not in text
        assert "output_schema" not in text


def test_c2_object_check_refuses_a_malformed_program(tmp_path: Path) -> None:
    assert ctx_run("object", "check", tool_manifest(tmp_path, "ok.prog", program=PROGRAM)).rc == 0
    malformed = [[1], "object", 7, True, False, None, {"type": "nope"}, {"required": 3}]
    for index, program in enumerate(malformed):
        manifest = tool_manifest(tmp_path, f"bad{index}.prog", program=program)
        checked = ctx_run("object", "check", manifest)
        assert checked.rc == 1, (program, checked)
        assert "program" in checked.err, checked


@pytest.mark.parametrize(
    "program", [[1], "object", True, None, {"type": "nope"}, {"properties": []}], ids=repr
)
def test_c2_object_install_of_a_malformed_program_leaves_no_available_tool(storage, program):
    """C-2: "validated by object install …: malformed, non-object, or failing schema
    validation makes the tool unavailable" — refused, or installed as unavailable."""
    env = clean_env(CTX_STORAGE=str(storage))
    manifest = tool_manifest(storage.parent, "demo.prog", program=program)

    ctx_run("object", "install", manifest, "--tier", "system", env=env)

    assert listed_status(env, "demo.prog") in (None, "unavailable", "damaged")


MALFORMED_PROGRAMS = [b"{not json", b"[]", b'"object"', b"true", b"", b'{"type": "nope"}']


@needs_root
def test_c2_a_malformed_program_control_makes_the_tool_unavailable(host) -> None:
    """C-2 at the layout check (ctx object list), at a call and at bootstrap: a program
    control that is not JSON, not an object or not a valid JSON Schema."""
    storage = host / "storage"
    env = make_agent(host, ["demo.prog"])
    install(tool_manifest(host, "demo.prog", program=PROGRAM), env)
    allow_in_tool_policy(storage, "demo.prog")
    assert listed_status(env, "demo.prog") == "available"
    assert run_native(env, "demo.prog", {"text": "hi"})[0].rc == 0

    for control in MALFORMED_PROGRAMS:
        (storage / "tool" / "demo.prog.d" / "program").write_bytes(control)

        assert listed_status(env, "demo.prog") == "unavailable", control
        ran, result = run_native(env, "demo.prog", {"text": "hi"})
        assert ran.rc != 0 and result["status"] != "ok", (control, ran)

    program = storage / "tool" / "demo.prog.d" / "program"
    program.unlink()
    program.mkdir()  # not a file at all
    assert listed_status(env, "demo.prog") in ("unavailable", "damaged")
    ran, result = run_native(env, "demo.prog", {"text": "hi"})
    assert ran.rc != 0 and result["status"] != "ok", ran
    program.rmdir()
    program.write_bytes(MALFORMED_PROGRAMS[-1])

    booted = ctx_run("bootstrap", "--storage", storage)
    assert "demo.prog" in booted.out + booted.err, booted  # bootstrap validates it
    assert listed_status(env, "demo.prog") == "unavailable"  # and leaves it unavailable


@needs_root
def test_c2_a_missing_program_is_fine_and_a_valid_one_grants_nothing(host) -> None:
    storage = host / "storage"
    env = make_agent(host, ["demo.plain", "demo.prog"])
    install(tool_manifest(host, "demo.plain"), env)
    install(tool_manifest(host, "demo.prog", program=PROGRAM), env)
    assert not (storage / "tool" / "demo.plain.d" / "program").exists()
    assert json.loads((storage / "tool" / "demo.prog.d" / "program").read_text()) == PROGRAM
    assert listed_status(env, "demo.plain") == "available"
    assert listed_status(env, "demo.prog") == "available"

    # a valid program in place, the tool's own policy silent: refused (grants nothing)
    ran, result = run_native(env, "demo.prog", {"text": "hi"})
    assert ran.rc != 0 and "EACCES" in json.dumps(result), ran

    allow_in_tool_policy(storage, "demo.plain")
    ran, result = run_native(env, "demo.plain", {"text": "hi"})
    assert ran.rc == 0 and result["status"] == "ok", ran
