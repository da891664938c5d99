"""Sentences of the original design text (``000_6eed129ebbb3b9cb.txt``, Chinese; it wins where
SPEC.md and it disagree) that state something concretely which SPEC.md states less precisely
or not at all, each driven through the installed ``ctx``/``ctxmcp`` as a user would:

* MCP-backed capabilities are not built-in defaults, and CortexFS defines no place for MCP
  configurations (M-1);
* the printed projection pipeline ``ctxmcp project … --out ./mcp-manifests`` →
  ``ctx object check ./mcp-manifests/<server>.<tool>.manifest.json`` →
  ``ctx object install --source STORAGE … --tier system``, and MCP being neither a namespace
  nor a policy class (M-1, M-4, P-3, T-8);
* the example agent request, as printed, and the agent's search path of the example
  ``/ctx/tool``, ``/ctx/home/<uid>/tool``, ``/ctx/shared/project-a/tool`` (A-3, T-4);
* ``origin`` as an optional, diagnostic file that nothing may depend on (T-1, R-5, A-4, A-5).

Each test's docstring quotes the sentence it follows and names the nearest SPEC id."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"

needs_time_server = pytest.mark.skipif(
    not TIME_SERVER.exists(), reason="needs the venv's mcp-server-time"
)

# The example agent request of the original text, character for character.
EXAMPLE_REQUEST = """\
{
  "name": "reviewer",
  "label": "reviewer_t",
  "model": ["openai/gpt-5.6"],
  "tools": ["fs.read"],
  "shared": {
    "project-a": ["read"]
  },
  "mount": [
    ["/work", "/work", "ro"],
    ["/shared/project-a", "/shared/project-a", "ro"]
  ]
}
"""


def ctxmcp(*args: str | os.PathLike, env: dict[str, str], cwd: Path) -> Run:
    """``ctxmcp ARGS...`` run directly, as ``ctx_run`` runs ``ctx``."""
    argv = [str(CTXMCP), *map(str, args)]
    proc = subprocess.run(argv, input=b"", capture_output=True, env=env, cwd=cwd, timeout=120)
    return Run(
        argv[1:],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def native_result(run: Run) -> dict:
    """The ``result`` frame a ``ctx run --native`` call ends with."""
    frames = [json.loads(line) for line in run.lines() if line.strip()]
    assert frames and frames[-1]["type"] == "result", run
    return frames[-1]


# ------------------------------------------------------------------------------- MCP sources


def test_bootstrap_installs_no_mcp_backed_tool_and_no_mcp_configuration(storage: Path) -> None:
    """M-1, R-5.  Original: "MCP-backed capabilities 可以投影为普通工具，但不作为内置默认项"
    and "CortexFS 不定义 MCP server 的配置存放位置".  A freshly bootstrapped root holds no tool
    with an ``mcp`` locator in any tier, no MCP configuration file anywhere, and no ``mcp/``
    at its root."""
    assert set(os.listdir(storage)) == ROOT_ENTRIES
    for dirpath, dirnames, filenames in os.walk(storage):
        here = Path(dirpath)
        if here.name.endswith(".d"):
            assert "mcp" not in filenames + dirnames, here
        for name in filenames:
            assert "mcp" not in name.lower(), here / name
    listed = ctx_run("object", "list", "--json", env=clean_env(CTX_STORAGE=str(storage)))
    assert listed.rc == 0, listed
    for tool in listed.json():
        assert not (Path(tool["path"] + ".d") / "mcp").exists(), tool


def test_ctxmcp_looks_for_no_configuration_and_starts_no_server_it_was_not_named(
    tmp_path: Path,
) -> None:
    """M-1.  Original: "ctxmcp 将显式选择的外部 stdio server 投影为普通工具" and "CortexFS 不定义
    MCP server 的配置存放位置".  Configurations lie where MCP clients commonly keep them
    (``$HOME/.config/example/mcp.json``, ``$HOME/.mcp.json``, ``./.mcp.json``,
    ``./mcp.json``), each naming one server that would leave a mark when started: without
    ``--config`` ``list`` and ``project`` are usage errors (exit 2), and without ``--server``
    too, even for a configuration of a single server; no server is started, nothing is
    written."""
    home, work = tmp_path / "home", tmp_path / "work"
    marker = tmp_path / "started"
    server = tmp_path / "server.sh"
    server.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    server.chmod(0o755)
    config = json.dumps({"mcpServers": {"only": {"command": str(server)}}})
    places = [
        home / ".config" / "example" / "mcp.json",
        home / ".mcp.json",
        work / ".mcp.json",
        work / "mcp.json",
    ]
    for place in places:
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_text(config)
    env = clean_env(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    before = snapshot(tmp_path)
    out = tmp_path / "out"
    attempts = [
        ("list", "--server", "only"),
        ("project", "--runtime-config", "/mcp/mcp.json", "--server", "only", "--out", out),
        ("list", "--config", places[0]),
        ("project", "--config", places[0], "--runtime-config", "/mcp/mcp.json", "--out", out),
    ]
    for args in attempts:
        r = ctxmcp(*args, env=env, cwd=work)
        assert r.rc == 2, r
        assert "Traceback" not in r.err, r
    assert not marker.exists()
    assert snapshot(tmp_path) == before


@needs_time_server
def test_the_printed_projection_pipeline_names_candidates_and_installs_with_source(
    _template: Path, tmp_path: Path
) -> None:
    """M-1, M-4, T-8, P-3, R-2.  Original:
    ``ctxmcp project --config "$HOME/.config/example/mcp.json" --runtime-config
    /workspace/.mcp.json --server github --out ./mcp-manifests``, then
    ``ctx object check ./mcp-manifests/github.search_issues.manifest.json`` and
    ``ctx object install --source /var/lib/cortexfs/storage/current ./mcp-manifests/…
    --tier system``; "投影出的工具控制文件仍是普通工具 ABI: schema, policy, status, log";
    "MCP 只说明工具来源；不是新命名空间、策略类".  With the time server: the candidates are
    ``./mcp-manifests/time.<tool>.manifest.json``, one per listed tool, in a directory made
    for them; ``--source`` installs into the root it names even when ``CTX_STORAGE`` names
    another; the tool has the ordinary controls and a locator of exactly transport, config,
    server and tool; its policy grants no one; ``mcp:`` is no policy class; the root keeps
    its six entries."""
    root = copy_of_root(_template, tmp_path / "root")
    decoy = copy_of_root(_template, tmp_path / "decoy")
    home, work = tmp_path / "home", tmp_path / "work"
    config = home / ".config" / "example" / "mcp.json"
    config.parent.mkdir(parents=True)
    work.mkdir()
    config.write_text(json.dumps({"mcpServers": {"time": {"command": str(TIME_SERVER)}}}))
    env = clean_env(HOME=str(home), CTX_STORAGE=str(decoy))
    roots_before = (snapshot(root), snapshot(decoy))

    listed = ctxmcp("list", "--config", config, "--server", "time", env=env, cwd=work)
    assert listed.rc == 0, listed
    names = [line.split("\t")[0] for line in listed.lines() if line.strip()]
    assert "time.get_current_time" in names and all(n.startswith("time.") for n in names)

    projected = ctxmcp(
        "project", "--config", config, "--runtime-config", "/workspace/.mcp.json",
        "--server", "time", "--out", "./mcp-manifests", env=env, cwd=work,
    )  # fmt: skip
    assert projected.rc == 0, projected
    out = work / "mcp-manifests"
    assert sorted(os.listdir(out)) == sorted(f"{n}.manifest.json" for n in names)
    assert (snapshot(root), snapshot(decoy)) == roots_before  # a candidate installs nothing

    candidate = "./mcp-manifests/time.get_current_time.manifest.json"
    document = json.loads((work / candidate).read_text())
    assert document["manifest"] == 2 and document["name"] == "time.get_current_time"
    checked = ctx_run("object", "check", candidate, env=env, cwd=work)
    assert checked.rc == 0, checked

    installed = ctx_run(
        "object", "install", "--source", root, candidate, "--tier", "system", env=env, cwd=work
    )
    assert installed.rc == 0, installed
    assert snapshot(decoy) == roots_before[1]
    executable = root / "tool" / "time.get_current_time"
    assert executable.is_file() and executable.stat().st_mode & stat.S_IXUSR
    controls = executable.with_name("time.get_current_time.d")
    for control in ("schema", "policy", "status", "log"):
        assert (controls / control).is_file(), control
    locator = json.loads((controls / "mcp").read_text())
    assert locator == {
        "transport": "stdio",
        "config": "/workspace/.mcp.json",
        "server": "time",
        "tool": "get_current_time",
    }
    assert set(os.listdir(root)) == ROOT_ENTRIES
    asked = ctx_run(
        "policy", "query", "--policy", controls / "policy",
        "coder_t", "tool:time.get_current_time", "execute", env=env,
    )  # fmt: skip
    assert (asked.rc, asked.out) == (1, "deny\n"), asked

    rules = tmp_path / "rules"
    rules.write_text("allow coder_t tool:time.get_current_time execute\n")
    assert ctx_run("policy", "check", rules, env=env).rc == 0
    rules.write_text("allow coder_t mcp:time execute\n")
    refused = ctx_run("policy", "check", rules, env=env)
    assert refused.rc == 1 and "EINVAL" in refused.err, refused


# ------------------------------------------------------------------------------------ agents


def test_the_example_agent_request_as_printed(storage: Path) -> None:
    """A-3, T-4, S-6, P-6.  Original: the example request (``reviewer``, ``reviewer_t``,
    ``openai/gpt-5.6``, ``fs.read``, ``project-a: [read]``, two ``ro`` mounts); "请求成功后，
    工具创建普通 agent/<name> executable 条目…以及 agent/<name>.d/* 控制文件。不得创建新根命名空间";
    the controls it names (policy, mount, model, system.md, prompt.template.md); "不存在
    agent/<name>.d/tool", "CortexFS 不提供 agent/<name>.d/shared"; and "代理按 CTX_PATH 搜索工具:
    /ctx/tool/fs.read, /ctx/home/1000/tool/fs.read, /ctx/shared/project-a/tool/fs.read"."""
    env = clean_env(CTX_STORAGE=str(storage))
    agents_before = {n for n in os.listdir(storage / "agent") if not n.startswith(".")}
    made = ctx_run("agent", "create", "-", "--json", input=EXAMPLE_REQUEST, env=env)
    assert made.rc == 0, made
    uid = made.json()["identity"]["uid"]

    assert set(os.listdir(storage)) == ROOT_ENTRIES
    agents = {n for n in os.listdir(storage / "agent") if not n.startswith(".")}
    assert agents - agents_before == {"reviewer", "reviewer.d"}
    entry = storage / "agent" / "reviewer"
    assert entry.is_file() and entry.stat().st_mode & stat.S_IXUSR
    controls = set(os.listdir(storage / "agent" / "reviewer.d"))
    assert {"policy", "mount", "model", "system.md", "prompt.template.md"} <= controls
    assert "tool" not in controls and "shared" not in controls, controls

    policy = storage / "agent" / "reviewer.d" / "policy"
    for wanted, answer in (
        (("tool:fs.read", "execute"), 0),
        (("model:openai/gpt-5.6", "use"), 0),
        (("shared:project-a", "read"), 0),
        (("shared:project-a", "write"), 1),
        (("network:default", "connect"), 1),
    ):
        asked = ctx_run("policy", "query", "--policy", policy, "reviewer_t", *wanted, env=env)
        assert asked.rc == answer, asked
    targets = [entry[1] for entry in json.loads((storage / "agent/reviewer.d/mount").read_text())]
    assert {"/work", "/shared/project-a"} <= set(targets), targets

    shown = ctx_run("agent", "show", "reviewer", "--json", env=env)
    assert shown.rc == 0, shown
    assert shown.json()["ctx_path"] == f"/ctx/tool:/ctx/home/{uid}/tool:/ctx/shared/project-a/tool"


# ------------------------------------------------------------------------------------ origin


def grant_call(root: Path, tool: str) -> tuple[dict[str, str], Callable]:
    """Agent ``coder`` (label ``coder_t``) allowed ``tool`` in both policies of P-6, and for
    ``agent.create`` the rules of the original's example for ``review-1`` (and ``review-2``).
    Returns the environment aimed at ``root`` and, for attempt N, the native input of one call
    of ``tool`` that must succeed with the check of its effect (None: the result suffices)."""
    env = clean_env(CTX_STORAGE=str(root))
    request = {"name": "coder", "label": "coder_t", "tools": [tool]}
    made = ctx_run("agent", "create", "-", input=json.dumps(request), env=env)
    assert made.rc == 0, made
    with (root / "tool" / f"{tool}.d" / "policy").open("a") as rules:
        rules.write(f"allow coder_t tool:{tool} execute\n")
    if tool == "agent.create":
        with (root / "agent" / "coder.d" / "policy").open("a") as rules:
            for child in ("review-1", "review-2"):
                rules.write(f"allow coder_t agent:{child} create\n")
                rules.write(f"allow coder_t agent:{child} start\n")
    calls = {
        "fs.read": lambda n: ({"path": "/ctx/tool/fs.read.d/name"}, None),
        "agent.update": lambda n: (
            {"control": "system.md", "content": f"Answer briefly ({n}).\n"},
            lambda: (root / "agent/coder.d/system.md").read_text() == f"Answer briefly ({n}).\n",
        ),
        "agent.create": lambda n: (
            {"name": f"review-{n}", "label": f"review-{n}_t"},
            lambda: (root / "agent" / f"review-{n}").is_file(),
        ),
    }
    return env, calls[tool]


@pytest.mark.parametrize(
    "tool",
    [
        "fs.read",
        "agent.update",
        "agent.create",
    ],
)
def test_a_core_tool_works_without_its_diagnostic_origin_file_after_bootstrap(
    tool: str, _template: Path
) -> None:
    """T-1, R-5, A-4, A-5.  Original: "实现可选地暴露诊断 origin 文件" and "origin 不是稳定
    ABI。严格客户端不得依赖。".  A core tool called through the runner by an agent allowed it
    succeeds; its ``origin`` removed (a file the implementation may or may not expose) and
    ``ctx bootstrap`` run, the same call still succeeds: the diagnostic file is not what
    the tool's working depends on, or bootstrap puts it back."""
    top = new_scratch_dir(SCRATCH)
    try:
        root = copy_of_root(_template, top / "storage")
        env, call = grant_call(root, tool)

        for attempt, before in ((1, True), (2, False)):
            if not before:
                (root / "tool" / f"{tool}.d" / "origin").unlink()
                again = ctx_run("bootstrap", "--storage", root)
                assert again.rc == 0, again
            given, effect = call(attempt)
            ran = ctx_run(
                "run", "--agent", "coder", "--native", tool, input=json.dumps(given), env=env
            )
            result = native_result(ran)
            assert (ran.rc, result["status"]) == (0, "ok"), (attempt, ran)
            assert effect is None or effect(), (attempt, ran)
    finally:
        shutil.rmtree(top, ignore_errors=True)
