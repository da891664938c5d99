"""MCP-backed tools installed and run like any tool, as a real agent (SPEC §10 M-4, T-3, P-6).

``ctxmcp project`` writes the candidate, ``ctx object install`` installs it with the bridge,
and the agent calls it through the whole authority chain.  The server runs as the agent: its
configuration is read in the agent's view, so the agent must be able to read it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.mcp.client import DEFAULT_TIMEOUT
from cortexfs.tools.install import install_manifest, parse_tier
from cortexfs.tools.manifest import load_manifest
from tests.mcp.test_ctxmcp import SCRIPTED, TIME_SERVER, ctxmcp, processes_running, tool
from tests.tools.support import World

CTX = [sys.executable, "-m", "cortexfs"]
SYSTEM_PYTHON = "/usr/bin/python3"  # world-executable, unlike a venv under a private home


def host_config_dir(world: World) -> Path:
    """A directory of the host's, which agents see read-only at ``/mcp`` (:func:`coder`): the
    configuration names the command a tool runs, so no uid but root and the tool's owner may
    be able to change it (StrictModes), as the agent could in its own workspace."""
    directory = world.workspace.parent / "mcp"
    directory.mkdir(mode=0o755, exist_ok=True)
    return directory


def coder(world: World, tools: list[str], name: str = "coder") -> None:
    """Agent ``name`` with ``tools``, its workspace and the host's configurations mounted."""
    mounts = [
        [str(world.workspace), "/workspace", "rw"],
        [str(host_config_dir(world)), "/mcp", "ro"],
    ]
    world.agent(name, tools=tools, mounts=mounts)


def serve(world: World, *, config_dir: Path | None = None, **script: object) -> Path:
    """A configuration in the host's configuration directory (or ``config_dir``) whose server
    ``fake`` follows ``script``; the server's files are readable by the agent."""
    directory = config_dir or host_config_dir(world)
    shutil.copy(SCRIPTED, directory / "server.py")
    (directory / "script.json").write_text(json.dumps(script))
    config = directory / "mcp.json"
    entry = {
        "command": SYSTEM_PYTHON,
        "args": [str(directory / "server.py"), str(directory / "script.json")],
    }
    config.write_text(json.dumps({"mcpServers": {"fake": entry}}))
    for path in (directory / "server.py", directory / "script.json", config):
        path.chmod(0o644)
    return config


def install_projected(world: World, config: Path, runtime_config: str, name: str) -> None:
    out = world.scratch / "candidates" / name  # one projection each: earlier ones stay
    done = ctxmcp(
        "project", "--config", str(config), "--runtime-config", runtime_config,
        "--server", "fake", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = load_manifest(out / f"{name}.manifest.json")
    install_manifest(world.root, manifest, parse_tier(world.root, "system"))
    world.allow_tool(name)


@pytest.fixture
def echo(world: World) -> World:
    config = serve(world, tools=[tool("echo"), tool("fail")])
    install_projected(world, config, "/mcp/mcp.json", "fake.echo")
    install_projected(world, config, "/mcp/mcp.json", "fake.fail")
    coder(world, ["fake.echo", "fake.fail"])
    return world


def test_an_agent_calls_an_mcp_backed_tool_through_the_chain(echo: World) -> None:
    result = echo.run("fake.echo", {"question": 42})

    assert result.ok, result.error
    assert result.output["structuredContent"]["echo"] == {"question": 42}
    assert result.output["structuredContent"]["uid"] == echo.user.uid, "runs as the agent"
    assert result.output["isError"] is False
    assert [e["type"] for e in echo.events()][-2:] == ["tool_call", "tool_result"]


def test_an_error_result_fails_the_call(echo: World) -> None:
    result = echo.run("fake.fail", {})

    assert not result.ok
    assert result.output["error"] == "EREMOTEIO"
    assert "failed on purpose" in result.output["message"]


@pytest.mark.parametrize("option", ["--help", "-h"])
def test_help_in_terminal_mode_describes_the_tool_and_starts_no_server(
    echo: World, option: str
) -> None:
    """A person asking what a remote tool does must not run it: ``--help`` alone is answered
    from the tool's controls; any other lone word still goes to the server as ``input``."""
    run = [
        "--storage", str(echo.root), "run", "--agent", "coder", "fake.echo", option,
    ]  # fmt: skip
    helped = subprocess.run([*CTX, *run], capture_output=True, text=True, stdin=subprocess.DEVNULL)

    assert helped.returncode == 0, helped.stderr
    description = (echo.root / "tool/fake.echo.d/description").read_text().strip()
    assert helped.stdout.startswith(description)
    assert "input (a JSON object) as its schema states it:" in helped.stdout
    assert "echo" not in helped.stdout.split(description, 1)[1].split("schema states it")[0]
    assert echo.events()[-1]["type"] == "tool_result"  # recorded like any other call
    word = subprocess.run([*CTX, *run[:-1], "hello"], capture_output=True, text=True)
    assert '"input": "hello"' in word.stdout or "hello" in word.stdout, word.stderr


def test_help_shows_what_a_server_wrote_escaped(world: World) -> None:
    """The description is the server's text: an escape sequence or a bidirectional override
    in it reaches the terminal only as its escape, as ``ctx session show`` shows such text."""
    hostile = tool("echo")
    hostile["description"] = "harmless\x1b]0;owned\x07\x1b[2J\u202egnp.exe\u202c tool"
    install_projected(world, serve(world, tools=[hostile]), "/mcp/mcp.json", "fake.echo")
    coder(world, ["fake.echo"])
    run = ["--storage", str(world.root), "run", "--agent", "coder", "fake.echo", "--help"]

    helped = subprocess.run([*CTX, *run], capture_output=True, stdin=subprocess.DEVNULL)

    assert helped.returncode == 0, helped.stderr
    assert b"\x1b" not in helped.stdout and "\u202e".encode() not in helped.stdout
    assert helped.stdout.startswith(b"harmless\\x1b]0;owned\\x07\\x1b[2J\\u202egnp.exe")


def test_help_shows_a_description_that_is_not_utf8_as_a_listing_does(echo: World) -> None:
    """A byte of the description that is no UTF-8 (written there by hand) is shown replaced,
    as ``ctx object list`` shows it, not taken for a damaged tool that no listing reports."""
    (echo.root / "tool/fake.echo.d/description").write_bytes(b"Echoes \xff the input.\n")
    run = ["--storage", str(echo.root), "run", "--agent", "coder", "fake.echo", "--help"]

    helped = subprocess.run([*CTX, *run], capture_output=True, text=True, stdin=subprocess.DEVNULL)

    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Echoes \ufffd the input.\n")


def test_the_tool_is_refused_without_the_agents_grant(echo: World) -> None:
    echo.agent("other", tools=[])

    result = echo.run("fake.echo", {}, agent="other")

    assert not result.ok and result.error is not None and result.error.errno == 13  # EACCES


def test_a_configuration_outside_the_agents_mounts_is_not_read(world: World) -> None:
    elsewhere = world.scratch / "host-config"
    elsewhere.mkdir()
    config = serve(world, config_dir=elsewhere, tools=[tool("echo")])
    install_projected(world, config, str(config), "fake.echo")
    coder(world, ["fake.echo"])

    result = world.run("fake.echo", {})

    assert not result.ok and result.output["error"] == "EACCES", result.output


def test_a_symlinked_configuration_is_never_followed(world: World) -> None:
    config = serve(world, tools=[tool("echo")])
    (host_config_dir(world) / "link.json").symlink_to(config)
    install_projected(world, config, "/mcp/link.json", "fake.echo")
    coder(world, ["fake.echo"])

    result = world.run("fake.echo", {})

    assert not result.ok and result.output["error"] == "ELOOP", result.output


def test_a_timeout_kills_the_bridge_and_its_server(world: World) -> None:
    config = serve(world, tools=[tool("echo")])
    install_projected(world, config, "/mcp/mcp.json", "fake.echo")
    (host_config_dir(world) / "script.json").write_text(json.dumps({"behaviour": "silent"}))
    coder(world, ["fake.echo"])

    result = world.run("fake.echo", {}, timeout=2)

    assert not result.ok and result.error is not None and "timed out" in str(result.error)
    # SIGKILL is delivered at once but takes effect when the process next runs: on a loaded
    # machine it may still be on its way out for a moment.
    deadline = time.monotonic() + 5
    while processes_running(host_config_dir(world) / "script.json") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_running(host_config_dir(world) / "script.json") == [], (
        "the server outlived the call"
    )


@pytest.mark.slow  # over half a minute by its nature: the client's own default, and more
def test_a_remote_tool_may_take_as_long_as_the_call_was_given(world: World) -> None:
    """The runner's timeout bounds a tool call; the MCP client's own default (ctxmcp
    --timeout) must not cut a slow remote tool shorter."""
    config = serve(world, tools=[tool("echo")])
    install_projected(world, config, "/mcp/mcp.json", "fake.echo")
    slower = DEFAULT_TIMEOUT + 2
    (host_config_dir(world) / "script.json").write_text(
        json.dumps({"tools": [tool("echo")], "call_seconds": slower})
    )
    coder(world, ["fake.echo"])

    result = world.run("fake.echo", {"slow": True}, timeout=slower + 30)

    assert result.ok, result.output
    assert result.output["structuredContent"]["echo"] == {"slow": True}


def test_the_published_server_through_the_installed_bridge(tmp_path: Path) -> None:
    """The real time server, called by the installed executable as a person would run it."""
    root = tmp_path / "storage"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": str(TIME_SERVER)}}}))
    out = tmp_path / "out"
    done = ctxmcp(
        "project", "--config", str(config), "--runtime-config", str(config),
        "--server", "time", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    storage.bootstrap(root)
    install_manifest(
        root, load_manifest(out / "time.get_current_time.manifest.json"), parse_tier(root, "system")
    )
    executable = root / "tool" / "time.get_current_time"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}

    native = subprocess.run(
        [str(executable), '{"timezone": "Asia/Tokyo"}'],
        capture_output=True, text=True, env={**environment, "CTX_MODE": "native"}, timeout=60,
    )  # fmt: skip
    text = subprocess.run(
        [str(executable), '{"timezone": "Etc/UTC"}'],
        capture_output=True, text=True, env=environment, timeout=60,
    )  # fmt: skip

    assert native.returncode == 0, native.stderr
    assert json.loads(native.stdout)["structuredContent"]["timezone"] == "Asia/Tokyo"
    assert text.returncode == 0 and '"timezone": "Etc/UTC"' in text.stdout
