"""ctxmcp and the bridge against servers that misbehave on purpose (SPEC §10, M-1, M-3, T-3).

Each server is ``scripted_server.py``, a real process: it sends lone surrogates, schemas and
messages nested too deep, references that lead outside the schema, pages that never end,
results the caller cannot be blamed for, and replaces OUT with a link into the storage root
while ctxmcp waits for it.  Every failure must be the server's, named with an errno, with
nothing half-written.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cortexfs import storage
from tests.mcp.test_bridge import coder, host_config_dir, install_projected, serve
from tests.mcp.test_ctxmcp import RUNTIME_CONFIG, ctxmcp, scripted, tool
from tests.support.cli import ctx
from tests.tools.support import World


def project(
    config: Path, out: Path, *extra: str, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "fake", "--out", str(out), *extra,
    )  # fmt: skip


def nested_schema(levels: int) -> dict[str, Any]:
    """An object schema whose ``properties`` nest ``levels`` deep (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def skipped(stderr: str) -> list[str]:
    return [line.split(":")[1].split()[-1] for line in stderr.splitlines() if "skipped" in line]


# ------------------------------------------------------------------ projection


def test_a_lone_surrogate_in_a_description_or_schema_is_reported_and_skipped(
    tmp_path: Path,
) -> None:
    config = scripted(
        tmp_path,
        tools=[
            tool("ok"),
            {"name": "said", "description": "bad \ud800", "inputSchema": {"type": "object"}},
            tool("typed", {"type": "object", "description": "x\udfff"}),
        ],
    )

    done = project(config, tmp_path / "out")

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert skipped(done.stderr) == ["said", "typed"]
    assert "'\\ud800', a lone surrogate" in done.stderr
    assert os.listdir(tmp_path / "out") == ["fake.ok.manifest.json"]
    assert done.stdout.split() == [str(tmp_path / "out" / "fake.ok.manifest.json")]


def test_a_schema_deeper_than_a_manifest_holds_is_skipped_and_the_rest_pass_check(
    tmp_path: Path,
) -> None:
    """64 levels of properties make a schema of 129 JSON levels: the manifest would hold 130,
    more than 'ctx object check' reads; 300 levels would run a recursive check out of stack."""
    tools = [tool("ok", nested_schema(63)), tool("deep", nested_schema(64))]
    config = scripted(tmp_path, tools=[*tools, tool("deeper", nested_schema(200))])

    done = project(config, tmp_path / "out")

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert skipped(done.stderr) == ["deep", "deeper"]
    assert "nests deeper than 127 levels" in done.stderr
    checked = ctx(tmp_path, "object", "check", str(tmp_path / "out" / "fake.ok.manifest.json"))
    assert checked.returncode == 0, checked.stderr


def test_a_candidate_larger_than_a_manifest_is_skipped_and_a_long_description_cut(
    tmp_path: Path,
) -> None:
    """'ctx object check' and 'install' refuse a manifest over 1 MiB: no such candidate is
    written, and a description cut to the 8192 characters a manifest holds is said so."""
    large = {"type": "object", "description": "z" * (1024 * 1024)}
    tools = [
        tool("large", large),
        {"name": "wordy", "description": "w" * 20_000, "inputSchema": {"type": "object"}},
        tool("small"),
    ]
    config = scripted(tmp_path, tools=tools)
    out = tmp_path / "out"

    done = project(config, out)
    report = project(config, tmp_path / "again", "--json")

    assert done.returncode == 1, done.stderr
    assert skipped(done.stderr) == ["large"]
    assert "a manifest is at most 1048576" in done.stderr
    assert "ctxmcp: note: fake.wordy: its description of 20000 characters was cut" in done.stderr
    assert sorted(os.listdir(out)) == ["fake.small.manifest.json", "fake.wordy.manifest.json"]
    for name in os.listdir(out):
        checked = ctx(tmp_path / "storage", "object", "check", str(out / name))
        assert checked.returncode == 0, checked.stderr
    wordy = json.loads((out / "fake.wordy.manifest.json").read_text())
    assert wordy["description"] == "w" * 8192
    notes = json.loads(report.stdout)["notes"]
    assert [(note["name"], "8192" in note["note"]) for note in notes] == [("fake.wordy", True)]


@pytest.mark.parametrize("command", ["list", "project"])
def test_a_message_nested_too_deep_is_a_protocol_error(tmp_path: Path, command: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    raw = '{"jsonrpc":"2.0","id":@ID@,"result":{"tools":' + deep + "}}"
    config = scripted(tmp_path, list_raw=raw)

    if command == "project":
        done = project(config, tmp_path / "out")
    else:
        done = ctxmcp("list", "--config", str(config), "--server", "fake")

    assert done.returncode == 1
    assert done.stderr.startswith("ctxmcp: EPROTO: server 'fake' broke the protocol: ")
    assert "nested deeper than 512 levels" in done.stderr  # client.MAX_MESSAGE_DEPTH
    assert not (tmp_path / "out").exists()


def test_a_reference_outside_the_schema_or_to_nothing_is_skipped(tmp_path: Path) -> None:
    local = {
        "type": "object",
        "$defs": {"n": {"type": "integer"}},
        "properties": {"a": {"$ref": "#/$defs/n"}},
    }
    tools = [
        tool("local", local),
        tool("file", {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}}),
        tool("web", {"type": "object", "properties": {"a": {"$ref": "https://example.com/s"}}}),
        tool("dangling", {"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}),
    ]
    config = scripted(tmp_path, tools=tools)

    done = project(config, tmp_path / "out")

    assert done.returncode == 1, done.stderr
    assert skipped(done.stderr) == ["file", "web", "dangling"]
    assert "refers to 'file:///etc/passwd', outside itself" in done.stderr
    assert "refers to '#/$defs/none', which it does not hold" in done.stderr
    assert os.listdir(tmp_path / "out") == ["fake.local.manifest.json"]


def test_pages_that_never_end_are_cut_off(tmp_path: Path) -> None:
    config = scripted(tmp_path, behaviour="new-cursors")

    done = ctxmcp("list", "--config", str(config), "--server", "fake", "--timeout", "5")

    assert done.returncode == 1
    assert done.stderr.startswith("ctxmcp: EPROTO: server 'fake' broke the protocol: ")
    assert "past 1000 pages" in done.stderr  # client.MAX_PAGES


def test_a_projection_that_fails_while_writing_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    """A file size limit stands for a full disk: the small candidate fits, the large does not."""
    big = {"type": "object", "description": "z" * 200_000}
    config = scripted(tmp_path, tools=[tool("a"), tool("b", big)])
    out = tmp_path / "out"
    limit = 64 * 1024
    command = [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()"]
    arguments = ["project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG]
    done = subprocess.run(
        [*command, *arguments, "--server", "fake", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ctxmcp: EFBIG: cannot write the candidate ")
    assert "fake.b.manifest.json" in done.stderr and "nothing was written" in done.stderr
    assert not out.exists() and done.stdout == ""  # made for the candidates, taken back
    again = project(config, out)
    assert again.returncode == 0, again.stderr  # nothing in the way


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_out_through_a_bind_mount_of_the_storage_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    bind = tmp_path / "bind"
    bind.mkdir()
    subprocess.run(["mount", "--bind", str(root), str(bind)], check=True)
    try:
        config = scripted(tmp_path, tools=[tool("t")])
        done = project(config, bind / "tool", "--storage", str(root))
    finally:
        subprocess.run(["umount", str(bind)], check=True)

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"ctxmcp: EINVAL: --out {bind / 'tool'} is inside ")
    assert "M-1" in done.stderr
    assert not (root / "tool" / "fake.t.manifest.json").exists()


def test_a_server_that_links_out_into_the_storage_root_writes_nothing_there(
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    out = tmp_path / "out"  # missing when checked; the server then makes it a link
    config = scripted(tmp_path, tools=[tool("t")], link=[str(root / "tool"), str(out)])

    done = project(config, out, "--storage", str(root))

    assert done.returncode != 0
    assert done.stderr.startswith(f"ctxmcp: EINVAL: --out {out} is inside ")
    assert "M-1" in done.stderr and "nothing was written" in done.stderr
    assert not (root / "tool" / "fake.t.manifest.json").exists()
    assert [name for name in os.listdir(root / "tool") if name.startswith(".fake")] == []


# ------------------------------------------------------------------ calls


def ready(world: World, **script: object) -> None:
    """``fake.echo`` projected from a server following ``script``, callable by ``coder``."""
    config = serve(world, tools=[tool("echo")])
    install_projected(world, config, "/mcp/mcp.json", "fake.echo")
    (host_config_dir(world) / "script.json").write_text(
        json.dumps({"tools": [tool("echo")], **script})
    )
    coder(world, ["fake.echo"])


def run_terminal(world: World, *argv: str) -> subprocess.CompletedProcess[str]:
    return ctx(world.root, "run", "--agent", "coder", "fake.echo", *argv)


def test_a_result_nested_too_deep_is_the_servers_protocol_error(world: World) -> None:
    deep = "[" * 5000 + "]" * 5000
    ready(
        world,
        call_raw='{"jsonrpc":"2.0","id":@ID@,"result":{"content":[],"structuredContent":'
        + deep
        + "}}",
    )

    result = world.run("fake.echo", {})

    assert not result.ok and result.output["error"] == "EPROTO", result.output
    assert "nested deeper than" in result.output["message"]
    assert "Traceback" not in json.dumps(result.output)


def test_a_lone_surrogate_in_a_result_is_the_servers_fault_in_both_modes(world: World) -> None:
    ready(world, call_text="hi \ud800 there")

    native = world.run("fake.echo", {})
    terminal = run_terminal(world, "{}")

    assert not native.ok and native.output["error"] == "EPROTO", native.output
    assert "lone surrogate" in native.output["message"]
    assert terminal.returncode == 1, terminal.stderr  # not 2: the input {} was fine
    assert "EPROTO" in terminal.stderr and "the input holds" not in terminal.stderr


def test_terminal_mode_checks_the_input_schema_before_the_server_starts(world: World) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    config = serve(world, tools=[tool("echo", schema)])
    install_projected(world, config, "/mcp/mcp.json", "fake.echo")
    record = world.workspace / "record.jsonl"
    script = {"tools": [tool("echo", schema)], "record": str(record)}
    (host_config_dir(world) / "script.json").write_text(json.dumps(script))
    coder(world, ["fake.echo"])
    record.touch()
    os.chown(record, world.user.uid, world.user.gid)

    refused = run_terminal(world, '{"n": "not-a-number", "extra": 1}')
    accepted = run_terminal(world, '{"n": 3}')

    assert refused.returncode == 2, refused.stderr
    assert "EINVAL" in refused.stderr and "schema of fake.echo" in refused.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    arguments = [c["params"]["arguments"] for c in calls if c.get("method") == "tools/call"]
    assert arguments == [{"n": 3}], "only the valid call reached the server"
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize("loose", ["file", "directory"])
def test_a_configuration_others_may_change_is_refused(world: World, loose: str) -> None:
    """Whoever may rewrite the configuration chooses the command the tool runs as the agent."""
    config = serve(world, tools=[tool("echo")])
    install_projected(world, config, "/mcp/mcp.json", "fake.echo")
    coder(world, ["fake.echo"])
    (config if loose == "file" else config.parent).chmod(0o666 if loose == "file" else 0o777)

    result = world.run("fake.echo", {})

    assert not result.ok and result.output["error"] == "EACCES", result.output
    shown = config if loose == "file" else config.parent
    assert f"but {shown} is writable by its group or by others" in result.output["message"]
    assert "chmod go-w" in result.output["message"]


def test_a_configuration_the_agent_owns_is_refused(world: World) -> None:
    config = serve(world, config_dir=world.workspace, tools=[tool("echo")])
    install_projected(world, config, "/workspace/mcp.json", "fake.echo")
    coder(world, ["fake.echo"])

    result = world.run("fake.echo", {})

    assert not result.ok and result.output["error"] == "EACCES", result.output
    assert f"but {world.workspace} belongs to uid {world.user.uid}" in result.output["message"]


def test_a_request_larger_than_a_pipe_to_a_server_that_writes_as_it_reads_is_answered(
    world: World,
) -> None:
    """A server that writes a log notification for each part of a request it reads (its
    output fills while the client still writes a request larger than the pipes): the client
    takes what it writes meanwhile, so neither waits on the other, and the call is answered.
    Before, both waited on full pipes until the client's deadline (ETIMEDOUT)."""
    ready(world, behaviour="chatty", call_text="read it all")

    result = world.run("fake.echo", {"text": "y" * 400_000})

    assert result.ok, result.output
    assert "read it all" in json.dumps(result.output), result.output


def test_a_server_that_logs_more_than_a_message_may_hold_while_it_reads_is_answered(
    world: World,
) -> None:
    """The same server writing 3 MB of log notification for each 64 KiB it reads, some 21 MB
    before it has read the request: nothing answers a notification, so the client drops them
    as they come, and what it keeps never reaches the 16 MiB it keeps at most."""
    ready(world, behaviour="chatty", chatty_bytes=3_000_000, call_text="read it all")

    result = world.run("fake.echo", {"text": "y" * 400_000})

    assert result.ok, result.output
    assert "read it all" in json.dumps(result.output), result.output
