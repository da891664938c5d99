"""``ctxmcp list`` and ``ctxmcp project`` against real stdio servers (SPEC §10, M-1..M-4).

The main path runs the published ``mcp-server-time`` (PyPI); what no published server does —
negotiating a draft version, offering illegal names, crashing, falling silent — is played by
``scripted_server.py``, a real process speaking the same protocol.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.mcp import ACCEPTED_VERSIONS, ANNOUNCED_VERSION
from cortexfs.mcp.candidates import write_candidates
from cortexfs.mcp.out_directory import check_out_directory
from cortexfs.mcp.project import Projection
from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.support.cli import ctx
from tests.support.users import UnprivilegedUser
from tests.tools.support import World, effective_user

TIME_SERVER = Path(sys.executable).with_name("mcp-server-time")
SCRIPTED = Path(__file__).with_name("scripted_server.py")
SECRET = "s3cret-token-never-copied"
RUNTIME_CONFIG = "/workspace/.mcp.json"


def ctxmcp(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A client configuration with the real time server, a scripted one and a remote one."""
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {
                        "command": str(TIME_SERVER),
                        "args": ["--local-timezone", "Etc/UTC"],
                        "env": {"API_TOKEN": SECRET},
                    },
                    "remote": {"type": "http", "url": "https://mcp.example.com/"},
                }
            }
        )
    )
    return path


def scripted(tmp_path: Path, name: str = "fake", **script: Any) -> Path:
    """A configuration whose server ``name`` follows ``script``."""
    script_path = tmp_path / f"{name}.script.json"
    script_path.write_text(json.dumps(script))
    path = tmp_path / f"{name}.mcp.json"
    entry = {"command": sys.executable, "args": [str(SCRIPTED), str(script_path)]}
    path.write_text(json.dumps({"mcpServers": {name: entry}}))
    return path


def processes_running(argument: Path) -> list[int]:
    """The live processes whose command line holds ``argument`` (zombies are not running)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or str(argument).encode() not in (
                (entry / "cmdline").read_bytes()
            ):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def tool(name: str, schema: object = None) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"does {name}",
        "inputSchema": {"type": "object"} if schema is None else schema,
    }


# ------------------------------------------------------------------- a published server


def test_list_names_each_tool_as_server_dot_tool(config: Path) -> None:
    listed = ctxmcp("list", "--config", str(config), "--server", "time")

    assert listed.returncode == 0, listed.stderr
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert names == ["time.get_current_time", "time.convert_time"]


def test_list_json_reports_the_negotiated_session(config: Path) -> None:
    listed = ctxmcp("list", "--config", str(config), "--server", "time", "--json")

    report = json.loads(listed.stdout)
    assert report["protocolVersion"] in ACCEPTED_VERSIONS
    assert report["serverInfo"]["name"]
    assert {entry["name"] for entry in report["tools"]} == {
        "time.get_current_time",
        "time.convert_time",
    }


def test_project_writes_candidates_that_ctx_object_check_accepts(
    config: Path, tmp_path: Path
) -> None:
    out = tmp_path / "candidates"
    storage = tmp_path / "storage"

    done = ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "time", "--out", str(out),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    files = sorted(path.name for path in out.iterdir())
    assert files == ["time.convert_time.manifest.json", "time.get_current_time.manifest.json"]
    manifest = json.loads((out / "time.get_current_time.manifest.json").read_text())
    assert manifest["mcp"] == {
        "transport": "stdio",
        "config": RUNTIME_CONFIG,
        "server": "time",
        "tool": "get_current_time",
    }
    assert manifest["cap"] == {"side_effects": False, "network": False}  # readOnly, closed world
    assert manifest["schema"]["required"] == ["timezone"]
    for path in out.iterdir():
        checked = ctx(storage, "object", "check", str(path))
        assert checked.returncode == 0, checked.stderr
        text = path.read_text()
        assert SECRET not in text and str(TIME_SERVER) not in text, "config copied (M-4)"
    assert not storage.exists(), "ctxmcp and object check write nothing under the root"


# --------------------------------------------------------------------------- refusals


def test_only_stdio_servers_are_projected(config: Path) -> None:
    refused = ctxmcp("list", "--config", str(config), "--server", "remote")

    assert refused.returncode == 2
    assert "ctxmcp: EINVAL" in refused.stderr and "stdio" in refused.stderr


@pytest.mark.parametrize(
    ("server", "config_text", "reason"),
    [
        ("absent", None, "ENOENT"),
        ("time", "not json", "EINVAL"),
        ("time", '{"servers": []}', "EINVAL"),
        ("bad name", None, "EINVAL"),
        ("time.x", None, "holds a '.'"),
        ("time", '{"mcpServers": {}, "mcpServers": {"time": {"command": "x"}}}', "twice"),
        ("time", "[" * 100_000 + "]" * 100_000, "nested deeper"),
    ],
)
def test_an_unusable_configuration_or_server_name_is_a_usage_error(
    config: Path, server: str, config_text: str | None, reason: str
) -> None:
    if config_text is not None:
        config.write_text(config_text)

    refused = ctxmcp("list", "--config", str(config), "--server", server)

    assert refused.returncode == 2 and reason in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_relative_runtime_config_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    config = scripted(tmp_path, record=str(record), tools=[tool("t")])
    out = tmp_path / "out"

    refused = ctxmcp(
        "project", "--config", str(config), "--runtime-config", ".mcp.json",
        "--server", "fake", "--out", str(out),
    )  # fmt: skip

    assert refused.returncode == 2 and "absolute" in refused.stderr
    assert not record.exists() and not out.exists()


@pytest.mark.parametrize(
    ("runtime_config", "reason"),
    [
        ("/workspace/../etc/.mcp.json", "'..' is not allowed"),
        ("/workspace/..", "'..' is not allowed"),
        ("/workspace/.mcp.json/", "must name the configuration file itself"),
        ("/", "must name the configuration file itself"),
    ],
)
def test_a_runtime_config_the_bridge_could_never_read_is_refused(
    tmp_path: Path, runtime_config: str, reason: str
) -> None:
    """M-4: the bridge reads the locator's path in the agent's view, which refuses '..' and
    opens a file: such a locator would make a tool that can never run."""
    record = tmp_path / "record.jsonl"
    config = scripted(tmp_path, record=str(record), tools=[tool("t")])
    out = tmp_path / "out"

    refused = ctxmcp(
        "project", "--config", str(config), "--runtime-config", runtime_config,
        "--server", "fake", "--out", str(out),
    )  # fmt: skip

    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("ctxmcp: EINVAL: --runtime-config"), refused.stderr
    assert reason in refused.stderr
    assert not record.exists() and not out.exists()


# ----------------------------------------------------------------- protocol versions (M-2)


def test_the_client_announces_2025_11_25_and_then_says_it_is_initialised(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    config = scripted(tmp_path, record=str(record), tools=[tool("t")])

    assert ctxmcp("list", "--config", str(config), "--server", "fake").returncode == 0

    messages = [json.loads(line) for line in record.read_text().splitlines()]
    assert messages[0]["method"] == "initialize"
    assert messages[0]["params"]["protocolVersion"] == ANNOUNCED_VERSION == "2025-11-25"
    assert [m["method"] for m in messages[1:]] == ["notifications/initialized", "tools/list"]


@pytest.mark.parametrize("version", ACCEPTED_VERSIONS)
def test_every_stable_version_is_accepted(tmp_path: Path, version: str) -> None:
    config = scripted(tmp_path, version=version, tools=[tool("t")])

    listed = ctxmcp("list", "--config", str(config), "--server", "fake", "--json")

    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["protocolVersion"] == version


@pytest.mark.parametrize("version", ["2026-06-30", "DRAFT-2026-v1", "2024-10-07", "", None])
def test_a_draft_unknown_or_future_version_is_refused(tmp_path: Path, version: str | None) -> None:
    config = scripted(tmp_path, version=version, tools=[tool("t")])
    out = tmp_path / "out"

    refused = ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "fake", "--out", str(out),
    )  # fmt: skip

    assert refused.returncode == 1
    assert "EPROTO" in refused.stderr and "M-2" in refused.stderr
    assert not out.exists()


# ---------------------------------------------------------------------- names (M-3)


def test_illegal_names_and_schemas_are_reported_and_skipped(tmp_path: Path) -> None:
    tools = [
        tool("search_issues"),
        tool("has space"),
        tool("a/b"),
        tool("x" * 60),  # fake.xxx… is longer than 64 bytes
        tool("bad_schema", {"type": "no-such-type"}),
        tool("-dash"),  # not a name alone, but fake.-dash is one: only the whole name counts
        tool("ends.d"),
    ]
    config = scripted(tmp_path, tools=tools, page=2)  # three pages
    out = tmp_path / "out"

    done = ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "fake", "--out", str(out), "--json",
    )  # fmt: skip

    assert done.returncode == 1, done.stderr  # the rest is written; the status says skipped
    report = json.loads(done.stdout)
    written = ["fake.search_issues.manifest.json", "fake.-dash.manifest.json"]
    assert report["written"] == [str(out / name) for name in written]
    skipped = {entry["tool"]: entry["problem"] for entry in report["skipped"]}
    assert set(skipped) == {"has space", "a/b", "x" * 60, "bad_schema", "ends.d"}
    assert "M-3" in skipped["has space"] and "64" in skipped["x" * 60]
    assert "JSON Schema" in skipped["bad_schema"]
    assert sorted(p.name for p in out.iterdir()) == sorted(written)


def test_a_schema_that_admits_no_arguments_object_is_skipped(tmp_path: Path) -> None:
    """tools/call sends the arguments as an object: a schema of another type names a tool no
    call could reach, so it is not projected; a schema without a type, or one that lists
    "object" among its types, is."""
    tools = [
        tool("text_only", {"type": "string"}),
        tool("numbers", {"type": ["number", "array"]}),
        tool("untyped", {"properties": {"q": {"type": "string"}}}),
        tool("nullable", {"type": ["object", "null"]}),
        {"name": "no_schema", "description": "gives no inputSchema"},
    ]
    config = scripted(tmp_path, tools=tools)
    out = tmp_path / "out"

    done = project(config, out, "--json")

    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["written"] == [
        str(out / f"fake.{n}.manifest.json") for n in ("untyped", "nullable")
    ]
    skipped = {entry["tool"]: entry["problem"] for entry in report["skipped"]}
    assert set(skipped) == {"text_only", "numbers", "no_schema"}
    assert "as an object" in skipped["text_only"] and "'string'" in skipped["text_only"]
    assert "as an object" in skipped["numbers"]
    assert skipped["no_schema"] == "the server gave no inputSchema; MCP requires one"


def test_a_server_name_with_a_dot_is_refused_since_its_tool_names_could_collide(
    tmp_path: Path,
) -> None:
    """Server 'a' with tool 'b.c' and server 'a.b' with tool 'c' would both be 'a.b.c': one
    installed over the other would put another server behind a tool already granted."""
    record = tmp_path / "record.jsonl"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"tools": [tool("b.c"), tool("c")], "record": str(record)}))
    entry = {"command": sys.executable, "args": [str(SCRIPTED), str(script)]}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"a": entry, "a.b": entry}}))

    def project_server(server: str) -> subprocess.CompletedProcess[str]:
        return ctxmcp(
            "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
            "--server", server, "--out", str(tmp_path / server),
        )  # fmt: skip

    refused = project_server("a.b")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("ctxmcp: EINVAL: server name 'a.b' holds a '.': ")
    assert "(M-3)" in refused.stderr and str(config) in refused.stderr
    assert not record.exists() and not (tmp_path / "a.b").exists()
    projected = project_server("a")
    assert projected.returncode == 0, projected.stderr
    assert sorted(path.name for path in (tmp_path / "a").iterdir()) == [
        "a.b.c.manifest.json",
        "a.c.manifest.json",
    ]


def project(config: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "fake", "--out", str(out), *options,
    )  # fmt: skip


def test_a_name_the_server_lists_twice_is_reported_and_neither_copy_written(
    tmp_path: Path,
) -> None:
    first = {**tool("search"), "description": "the first search"}
    second = {**tool("search"), "description": "the second search"}
    config = scripted(tmp_path, tools=[first, tool("other"), second])
    out = tmp_path / "out"

    as_text = project(config, out)
    listed = ctxmcp("list", "--config", str(config), "--server", "fake")
    shutil.rmtree(out)
    as_json = project(config, out, "--json")

    assert as_text.returncode == 1, as_text.stderr
    assert as_text.stdout.splitlines() == [str(out / "fake.other.manifest.json")]
    skips = [line for line in as_text.stderr.splitlines() if "skipped search" in line]
    assert len(skips) == 2 and all("2 tools named 'search'" in line for line in skips), skips
    assert "not projectable" in listed.stdout and listed.returncode == 0
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["written"] == [str(out / "fake.other.manifest.json")]
    assert [entry["tool"] for entry in report["skipped"]] == ["search", "search"]
    assert all("M-3" in entry["problem"] for entry in report["skipped"])
    assert sorted(p.name for p in out.iterdir()) == ["fake.other.manifest.json"]


def test_a_servers_control_characters_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    """A description (or a tool name) from a remote server may carry an escape sequence that
    retitles or rewrites the operator's terminal: listed, it is shown escaped."""
    titled = {**tool("search"), "description": "finds\x1b]0;PWNED\x07 things"}
    config = scripted(tmp_path, tools=[titled, tool("bad\x1b[2Jname")])

    listed = ctxmcp("list", "--config", str(config), "--server", "fake")

    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout
    assert "fake.search\tfinds\\x1b]0;PWNED\\x07 things" in listed.stdout.splitlines()
    assert "bad\\x1b[2Jname\t(not projectable" in listed.stdout


@pytest.mark.parametrize("replace", [[], ["--replace"]])
def test_a_directory_in_a_candidates_place_refuses_before_anything_is_written(
    config: Path, tmp_path: Path, replace: list[str]
) -> None:
    out = tmp_path / "out"
    (out / "time.convert_time.manifest.json").mkdir(parents=True)

    refused = ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "time", "--out", str(out), *replace,
    )  # fmt: skip

    assert refused.returncode == 1
    assert refused.stderr == (
        f"ctxmcp: EISDIR: {out}/time.convert_time.manifest.json: a directory where a candidate "
        "goes; move it away (--replace overwrites only files)\n"
    )
    assert sorted(os.listdir(out)) == ["time.convert_time.manifest.json"], "nothing written"


def test_an_earlier_candidate_is_never_overwritten_without_replace(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert project(scripted(tmp_path, tools=[tool("t")]), out).returncode == 0
    earlier = out / "fake.t.manifest.json"
    earlier.write_text('{"edited": "by hand"}\n')
    config = scripted(tmp_path, tools=[tool("t"), tool("new")])

    refused = project(config, out)

    assert refused.returncode == 1
    assert refused.stderr.startswith("ctxmcp: EEXIST: ") and str(earlier) in refused.stderr
    assert "--replace" in refused.stderr
    assert earlier.read_text() == '{"edited": "by hand"}\n'
    assert sorted(p.name for p in out.iterdir()) == ["fake.t.manifest.json"], "nothing written"

    replaced = project(config, out, "--replace", "--json")

    assert replaced.returncode == 0, replaced.stderr
    report = json.loads(replaced.stdout)
    assert report["replaced"] == [str(earlier)]
    assert sorted(report["written"]) == sorted([str(earlier), str(out / "fake.new.manifest.json")])
    assert json.loads(earlier.read_text())["name"] == "fake.t"
    again = project(config, out, "--replace")
    assert again.returncode == 0 and f"ctxmcp: replaced {earlier}" in again.stderr


@pytest.mark.parametrize("inside", ["storage", "storage/tool"])
@pytest.mark.parametrize("named_by", ["CTX_STORAGE", "--storage"])
def test_candidates_are_never_written_into_the_storage_root(
    config: Path, tmp_path: Path, inside: str, named_by: str
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    out = tmp_path / inside
    environment = {"CTX_STORAGE": str(root)} if named_by == "CTX_STORAGE" else {}
    option = ["--storage", str(root)] if named_by == "--storage" else []

    refused = ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "time", "--out", str(out), *option, env=environment,
    )  # fmt: skip

    assert refused.returncode == 2 and "EINVAL" in refused.stderr and "M-1" in refused.stderr
    assert os.listdir(root) == []


def needs_a_mount(test: Callable[..., None]) -> Callable[..., None]:
    for mark in NEEDS_A_MOUNT:
        test = mark(test)
    return test


@needs_a_mount
def test_candidates_are_never_written_through_a_mount_of_the_storage_root(
    config: Path, world: World, tmp_path: Path
) -> None:
    """M-1: a storage root mounted anywhere, not only at /ctx, is the tree agents see."""
    (world.root / "home" / "0").mkdir(exist_ok=True)
    mountpoint = world.scratch / "elsewhere"
    with mounted(world.root, mountpoint):
        for out in (mountpoint / "home" / "0" / "candidates", mountpoint):
            refused = ctxmcp(
                "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
                "--server", "time", "--out", str(out), env={"CTX_STORAGE": str(tmp_path)},
            )  # fmt: skip

            assert refused.returncode == 2, refused.stderr
            assert refused.stderr.startswith("ctxmcp: EINVAL: --out "), refused.stderr
            assert f"inside {mountpoint}" in refused.stderr and "M-1" in refused.stderr
    assert os.listdir(world.root / "home" / "0") == []


# ------------------------------------------------------------------ failing servers


def test_a_server_that_exits_is_reported_with_its_stderr(tmp_path: Path) -> None:
    config = scripted(tmp_path, behaviour="exit")

    refused = ctxmcp("list", "--config", str(config), "--server", "fake")

    assert refused.returncode == 1
    assert "EIO" in refused.stderr and "no such API key" in refused.stderr


def test_a_silent_server_times_out_and_is_killed(tmp_path: Path) -> None:
    config = scripted(tmp_path, behaviour="silent")

    refused = ctxmcp("list", "--config", str(config), "--server", "fake", "--timeout", "1")

    assert refused.returncode == 1 and "ETIMEDOUT" in refused.stderr
    assert processes_running(tmp_path / "fake.script.json") == [], "the server outlived ctxmcp"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_ctxmcp_takes_its_server_with_it(tmp_path: Path, stop: signal.Signals) -> None:
    """``timeout 10 ctxmcp list …`` or a closed terminal: the server runs in a session of
    its own, which the signal never reaches, so ctxmcp must end it on the way out."""
    record = tmp_path / "received.jsonl"
    config = scripted(tmp_path, behaviour="silent", record=str(record))
    running = subprocess.Popen(
        [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()",
         "list", "--config", str(config), "--server", "fake"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (record.exists() and record.read_text()):  # the server read initialize
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "the server never received initialize"
        time.sleep(0.05)

    running.send_signal(stop)
    running.communicate(timeout=60)

    left = processes_running(tmp_path / "fake.script.json")
    for pid in left:  # a silent server would otherwise sleep for an hour
        os.kill(pid, signal.SIGKILL)
    assert left == [], "the server outlived ctxmcp"
    assert running.returncode == -stop, "ends as the signal would have ended it"


def test_a_server_whose_pages_never_end_is_refused(tmp_path: Path) -> None:
    config = scripted(tmp_path, tools=[tool("a"), tool("b")], page=1, behaviour="same-cursor")

    refused = ctxmcp("list", "--config", str(config), "--server", "fake", "--timeout", "30")

    assert refused.returncode == 1
    assert refused.stderr.startswith("ctxmcp: EPROTO: server 'fake' broke the protocol: its ")
    assert "cursor '0' twice" in refused.stderr
    assert processes_running(tmp_path / "fake.script.json") == [], "the server outlived ctxmcp"


def test_a_command_that_cannot_start_is_named(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"gone": {"command": "/nonexistent/server"}}}))

    refused = ctxmcp("list", "--config", str(config), "--server", "gone")

    assert refused.returncode == 1 and "/nonexistent/server" in refused.stderr


def test_a_cwd_the_server_cannot_enter_is_named_not_its_command(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    entry = {"command": str(TIME_SERVER), "cwd": str(gone)}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": entry}}))

    refused = ctxmcp("list", "--config", str(config), "--server", "time")

    assert refused.returncode == 1
    assert refused.stderr == (
        f"ctxmcp: ENOENT: cannot start server 'time' (its cwd {gone}): No such file or directory\n"
    )


def test_ctxmcp_writes_nothing_but_the_candidates(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = set(os.listdir(tmp_path))

    ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "time", "--out", str(out),
    )  # fmt: skip

    assert set(os.listdir(tmp_path)) - before == {"out"}
    assert all(p.name.endswith(".manifest.json") for p in out.iterdir())


def test_an_out_directory_the_user_may_not_write_is_refused_naming_it(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Not with the name of a temporary file the kernel refused, and before any is made."""
    out = traversable_tmp / "out"
    out.mkdir(mode=0o755)
    candidate = Projection("t", "fake.t", "a tool", {"manifest": 2}, None)

    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        write_candidates([candidate], out)

    assert refused.value.errno == errno.EACCES
    assert refused.value.message.startswith(f"--out {out}: ctxmcp may not write into {out};")
    assert "give a directory you may write" in refused.value.message
    assert os.listdir(out) == []


def test_an_out_directory_the_user_may_write_but_not_read_is_refused_before_the_server(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """A drop directory (0300) takes new files, but the candidates are made durable through
    a descriptor of it, which only a reader gets: refused by the check made before the
    server starts, saying so, not by the write after it ran."""
    out = traversable_tmp / "drop"
    out.mkdir()
    os.chown(out, unprivileged_user.uid, unprivileged_user.gid)
    out.chmod(0o300)

    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        check_out_directory(out, None)

    assert refused.value.errno == errno.EACCES
    assert refused.value.message.startswith(
        f"--out {out}: ctxmcp may write into it but not read it, and it opens it to make the "
        "candidates durable"
    )


class _RecordingOps(durable.FsOps):
    """Real operations that note each call's name and its first argument."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []
        for name in ("create_file", "write", "fsync", "rename", "rename_noreplace", "link"):
            setattr(self, name, self._noted(name, getattr(super(), name)))

    def _noted(self, name: str, operation: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args[0]))
            return operation(*args, **kwargs)

        return run


@pytest.mark.parametrize("replace", [False, True])
def test_a_candidate_is_durable_before_its_name_appears(tmp_path: Path, replace: bool) -> None:
    """A crash never leaves an empty or partial candidate under the final name."""
    candidate = Projection("t", "fake.t", "a tool", {"manifest": 2, "name": "fake.t"}, None)
    ops = _RecordingOps()

    (written,) = write_candidates([candidate], tmp_path, replace=replace, ops=ops)

    names = [name for name, _ in ops.calls]
    publish = next(i for i, name in enumerate(names) if name.startswith(("rename", "link")))
    assert names[:3] == ["create_file", "write", "fsync"]
    assert ops.calls[publish][0] in ("rename", "rename_noreplace", "link")
    assert "fsync" in names[publish + 1 :]  # the directory holding the new name
    assert json.loads(written.path.read_text())["name"] == "fake.t"
    assert [p.name for p in tmp_path.iterdir()] == ["fake.t.manifest.json"]
