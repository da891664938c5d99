"""The letter of SPEC §10 to §14, read sentence by sentence, for the readings other files
leave open:

* M-1: ``ctxmcp`` installs nothing and makes no storage root, whatever ``CTX_STORAGE`` names;
* M-3: R-3 forbids a name "ending in ``.d``" (lower case): a remote tool ``x.D`` projects to
  the legal ``fake.x.D``, which ``ctx object check`` accepts and ``ctx object install``
  installs as an ordinary, available tool;
* M-4: the locator holds "the visible absolute config path" exactly as given; a runtime path
  that names no file (``/``, a trailing ``/``) or climbs (``..``) or is relative is refused;
* D-1: ``ctx man TOPIC`` prints the installed page byte for byte, under each spelling of the
  topic (``agent``, ``ctx.agent``, ``ctx.agent.md``);
* F-1: ``ctx mount MOUNTPOINT`` on something that is not an empty directory, or ``--as`` an
  illegal agent name (R-3), mounts nothing;
* N-1: liveness uses the lease's ``host``/``boot_id``/``expires_at``, "never a pid alone": a
  lease reduced to a pid is not requeued, even when that pid is dead.

Real ``ctx`` and ``ctxmcp`` processes, a real stdio MCP server (a short script), real
directories; nothing of the product is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    MAN_PAGES,
    REPO,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
)

CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
TOP = scratch_top(__file__)

# A stdio MCP server answering initialize with the client's version and listing the tools
# of its script (one JSON-RPC message a line each way).
SERVER = r"""
import json, sys
tools = json.load(open(sys.argv[1]))
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method, params = message["method"], message.get("params", {})
    if method == "initialize":
        result = {"protocolVersion": params.get("protocolVersion"),
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": tools}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "called"}], "isError": False}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"],
                          "error": {"code": -32601, "message": method}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


# ------------------------------------------------------------------------------- helpers


@pytest.fixture
def scratch() -> Iterator[Path]:
    made = new_scratch_dir(TOP)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def tool(name: str) -> dict:
    return {"name": name, "description": f"the tool {name}", "inputSchema": {"type": "object"}}


def server_config(directory: Path, *names: str, server: str = "fake") -> Path:
    """An MCP client configuration whose stdio server ``server`` lists a tool per name."""
    (directory / "server.py").write_text(SERVER)
    (directory / "tools.json").write_text(json.dumps([tool(name) for name in names]))
    entry = {
        "command": sys.executable,
        "args": [str(directory / "server.py"), str(directory / "tools.json")],
    }
    config = directory / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {server: entry}}))
    return config


def ctxmcp(*args: str | os.PathLike, env: dict[str, str] | None = None):
    return subprocess.run(
        [str(CTXMCP), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env if env is not None else clean_env(),
    )


def project(config: Path, out: Path, runtime: str = "/workspace/.mcp.json", **kw):
    return ctxmcp(
        "project", "--config", config, "--runtime-config", runtime,
        "--server", "fake", "--out", out, **kw,
    )  # fmt: skip


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point, by the kernel's own table."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == target for line in table)


# ------------------------------------------------------------------------------ M-1, M-3


def test_m1_ctxmcp_makes_no_storage_root_where_ctx_storage_points(scratch: Path) -> None:
    """M-1: "it installs nothing, grants no policy, writes nothing under /ctx": with
    ``CTX_STORAGE`` naming a root that does not exist, both commands succeed and the root is
    still not there afterwards; the candidates are the only files made."""
    config = server_config(scratch, "ok")
    root = scratch / "no-root-here"
    out = scratch / "out"
    env = clean_env(CTX_STORAGE=str(root))

    listed = ctxmcp("list", "--config", config, "--server", "fake", env=env)
    done = project(config, out, env=env)

    assert listed.returncode == 0 and "fake.ok" in listed.stdout, listed
    assert done.returncode == 0, done
    assert not root.exists()
    assert sorted(os.listdir(out)) == ["fake.ok.manifest.json"]


def test_m3_a_remote_tool_ending_in_capital_d_projects_checks_and_installs(
    scratch: Path, storage: Path
) -> None:
    """R-3 reserves the suffix ``.d`` (the control directory); ``.D`` is another suffix, so
    M-3's projected name ``fake.x.D`` is legal: it is written, ``ctx object check`` accepts
    it, and ``ctx object install`` makes ``tool/fake.x.D`` with its controls in
    ``tool/fake.x.D.d/``, an available tool named exactly so."""
    config = server_config(scratch, "x.D", "x.d")
    out = scratch / "out"

    done = project(config, out)
    candidate = out / "fake.x.D.manifest.json"
    checked = ctx_run("object", "check", candidate)
    installed = ctx_run(
        "object", "install", "--source", storage, candidate, "--tier", "system",
    )  # fmt: skip
    listed = ctx_run("object", "list", "--json", env=clean_env(CTX_STORAGE=str(storage)))

    # x.d is illegal (fake.x.d ends in .d): reported and skipped, so exit 1; x.D is written
    assert done.returncode == 1, done
    assert "fake.x.d" in done.stderr, done
    assert sorted(os.listdir(out)) == ["fake.x.D.manifest.json"]
    assert json.loads(candidate.read_text())["name"] == "fake.x.D"
    assert checked.rc == 0, checked
    assert installed.rc == 0, installed
    assert os.access(storage / "tool" / "fake.x.D", os.X_OK)
    assert (storage / "tool" / "fake.x.D.d" / "name").read_text().strip() == "fake.x.D"
    assert listed.rc == 0, listed
    statuses = {entry["name"]: entry["status"] for entry in listed.json()}
    assert statuses.get("fake.x.D") == "available", statuses


# ----------------------------------------------------------------------------------- M-4


@pytest.mark.parametrize(
    "runtime",
    ["/workspace/.mcp.json", "/a//b.json", "/srv/mcp config.json", "/a/./b.json"],
    ids=["plain", "double-slash", "space", "dot"],
)
def test_m4_the_locator_keeps_the_runtime_config_path_exactly_as_given(
    scratch: Path, runtime: str
) -> None:
    """M-4: the locator is "a strict stdio locator with ``transport``, the visible absolute
    config path, ``server`` and ``tool``": exactly these four keys, the path as the
    administrator gave it, the config's own path (where ctxmcp read it) nowhere."""
    config = server_config(scratch, "ok")
    out = scratch / "out"

    done = project(config, out, runtime=runtime)

    assert done.returncode == 0, done
    text = (out / "fake.ok.manifest.json").read_text()
    assert json.loads(text)["mcp"] == {
        "transport": "stdio",
        "config": runtime,
        "server": "fake",
        "tool": "ok",
    }
    assert str(config) not in text and str(scratch) not in text


@pytest.mark.parametrize(
    "runtime",
    ["/", "/workspace/", "/workspace/../.mcp.json", "workspace/.mcp.json", ""],
    ids=["root", "trailing-slash", "dotdot", "relative", "empty"],
)
def test_m4_a_runtime_config_that_is_no_absolute_file_path_is_refused_before_anything(
    scratch: Path, runtime: str
) -> None:
    """M-4's path must be the visible absolute path of the configuration *file*: a directory
    (``/``, a trailing ``/``), a path that climbs with ``..``, a relative or empty one is a
    usage error (exit 2, EINVAL), and OUT is not even made."""
    config = server_config(scratch, "ok")
    out = scratch / "out"

    refused = project(config, out, runtime=runtime)

    assert refused.returncode == 2, refused
    assert "EINVAL" in refused.stderr and "--runtime-config" in refused.stderr, refused
    assert "Traceback" not in refused.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------------- D-1


@pytest.mark.parametrize("topic", sorted(MAN_PAGES))
def test_d1_ctx_man_prints_the_installed_page_under_each_spelling(
    storage: Path, topic: str
) -> None:
    """D-1: "``ctx man TOPIC`` reads the installed file"; ``agent``, ``model``, … are aliases
    of ``ctx.agent.md``, …: the topic, ``ctx.TOPIC`` and the file name ``ctx.TOPIC.md`` print
    the installed page byte for byte, nothing on stderr (the page is this version's)."""
    page = storage / "shared" / "cortexfs-docs" / "man" / MAN_PAGES[topic]
    env = clean_env(CTX_STORAGE=str(storage))

    shown = [ctx_run("man", spelling, env=env) for spelling in (topic, f"ctx.{topic}", page.name)]

    for run in shown:
        assert run.rc == 0, run
        assert run.out == page.read_text(), run.argv
        assert run.err == "", run


def test_d1_an_edited_installed_page_is_what_ctx_man_prints(storage: Path) -> None:
    """D-1: ``ctx man`` "reads the installed file and falls back to a built-in copy": while
    an installed page is there, its text is what is printed (here an administrator's local
    line added to it), and ``ctx bootstrap`` then rebuilds the stale page."""
    page = storage / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md"
    original = page.read_text()
    mode = page.stat().st_mode
    page.chmod(0o644)
    page.write_text(original + "\nLocal note: ask the operator before installing tools.\n")
    page.chmod(mode & 0o7777)
    env = clean_env(CTX_STORAGE=str(storage))

    edited = ctx_run("man", "tool", env=env)
    repaired = ctx_run("bootstrap", env=env)
    again = ctx_run("man", "tool", env=env)

    assert edited.rc == 0, edited
    assert "Local note: ask the operator" in edited.out, edited
    assert repaired.rc == 0, repaired
    assert page.read_text() == original
    assert again.rc == 0 and again.out == original, again


# ----------------------------------------------------------------------------------- F-1


@pytest.mark.parametrize("shape", ["not-empty", "missing", "a-file"])
def test_f1_a_mountpoint_that_is_not_an_empty_directory_mounts_nothing(
    scratch: Path, storage: Path, shape: str
) -> None:
    """F-1: ``ctx mount MOUNTPOINT`` (``ctx mount --help``: "an empty directory"): a
    directory holding a file, a missing path and a regular file are refused at once with an
    errno word (ENOTEMPTY, ENOENT, ENOTDIR) and exit 1; nothing is mounted, nothing changed."""
    point = scratch / "point"
    expected = {"not-empty": "ENOTEMPTY", "missing": "ENOENT", "a-file": "ENOTDIR"}[shape]
    if shape == "not-empty":
        point.mkdir()
        (point / "kept").write_text("kept\n")
    elif shape == "a-file":
        point.write_text("a file\n")

    refused = ctx_run("mount", point, env=clean_env(CTX_STORAGE=str(storage)), timeout=30)

    assert refused.rc == 1, refused
    assert expected in refused.err and "Traceback" not in refused.err, refused
    assert not mounted(point)
    if shape == "not-empty":
        assert os.listdir(point) == ["kept"]
    elif shape == "a-file":
        assert point.read_text() == "a file\n"
    else:
        assert not point.exists()


@pytest.mark.parametrize("agent", ["a/b", "x.d", "..", "-x", "a" * 65])
def test_f1_as_an_illegal_agent_name_is_einval_and_mounts_nothing(
    scratch: Path, storage: Path, agent: str
) -> None:
    """F-1 with R-3: ``ctx mount MOUNTPOINT --as AGENT`` names an object; a name R-3 rejects
    is "rejected with EINVAL" (a usage error, exit 2) and nothing is mounted."""
    point = scratch / "point"
    point.mkdir()

    refused = ctx_run(
        "mount", point, f"--as={agent}", env=clean_env(CTX_STORAGE=str(storage)), timeout=30
    )

    assert refused.rc == 2, refused
    assert "EINVAL" in refused.err, refused
    assert not mounted(point)
    assert os.listdir(point) == []


# ----------------------------------------------------------------------------------- N-1


def test_n1_a_lease_reduced_to_a_dead_pid_is_not_requeued_on_that_pid_alone(
    storage: Path, scratch: Path
) -> None:
    """N-1: "Liveness across hosts uses the lease's ``host``/``boot_id``/``expires_at``,
    never a pid alone."  A claim's lease rewritten to hold only its pid (now dead) and a
    future expiry says nothing of which host or boot that pid belongs to: recover must not
    requeue the job on the dead pid; the job stays claimed and recover reports the lease."""
    env = clean_env(CTX_STORAGE=str(storage))
    request = scratch / "job.req.json"
    request.write_text(json.dumps({"tool": "fs.read", "input": {}}))
    assert ctx_run("queue", "publish", "-p", "proj", request, env=env).rc == 0
    holder = subprocess.Popen(["sleep", "600"])
    try:
        claimed = ctx_run(
            "queue", "claim", "-p", "proj", "--pid", str(holder.pid), "--ttl", "3600",
            "--json", env=env,
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert claimed.rc == 0, claimed
    job = claimed.json()["name"]
    queue = storage / "shared" / "proj" / "queue"
    lease_file = queue / "lease" / job / "worker"
    lease = json.loads(lease_file.read_text())
    for field in ("host", "boot_id", "expires_at"):
        assert field in lease, lease  # what N-1 says liveness uses
    reduced = {key: lease[key] for key in ("job", "worker", "pid", "claimed_at", "expires_at")}
    lease_file.write_text(json.dumps(reduced))

    recovered = ctx_run("queue", "recover", "-p", "proj", "--json", env=env)

    assert recovered.rc != 0, recovered  # something is wrong with the evidence: not success
    report = recovered.json()
    assert report["requeued"] == [], report
    assert os.listdir(queue / "pending") == []
    assert os.listdir(queue / "claimed") == [job]
    assert json.loads(lease_file.read_text()) == reduced  # evidence left as it was
    assert job in json.dumps(report["conflicts"] + report["errors"]), report
