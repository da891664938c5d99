"""Controls and policies are read with a size limit, and a tool is held whole to StrictModes
(SPEC P-5 step 6, P-6, T-1, R-5).

A control grown sparse to 4 GiB — anyone who may write one could do it — is refused with
EFBIG naming it and its limit, at once and without the memory to read it, by every command
that reads it; and a tool's executable or control the agent (or anyone but the host) could
rewrite is refused at step 6, as its policy and hooks are.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.tools.support import World

ECHO = "#!/bin/sh\ncat\n"
SPARSE = 4 << 30
POLICY_LIMIT = 16 * 1024 * 1024
CONTROL_LIMIT = 1024 * 1024


@pytest.fixture
def allowed(world: World) -> World:
    """Agent coder may run ``echo``: every step passes."""
    world.agent("coder", tools=["echo"])
    world.install("echo", ECHO)
    world.allow_tool("echo")
    return world


def _in_1_gib() -> None:
    """Run with 1 GiB of address space: a 4 GiB file read whole would end in MemoryError."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def bounded_ctx(root: Path, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``ctx ARGS…`` in 1 GiB of address space, and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cortexfs", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
        preexec_fn=_in_1_gib,
        timeout=60,
    )
    return time.monotonic() - started, done


def sparse(path: Path) -> None:
    os.truncate(path, SPARSE)


@pytest.mark.parametrize(
    ("control", "limit"),
    [
        ("policy", POLICY_LIMIT),
        ("identity", CONTROL_LIMIT),
        ("label", CONTROL_LIMIT),
        ("mount", CONTROL_LIMIT),
    ],
)
def test_a_sparse_agent_control_refuses_the_call_with_efbig(
    allowed: World, control: str, limit: int
) -> None:
    sparse(allowed.root / "agent/coder.d" / control)

    took, run = bounded_ctx(allowed.root, "run", "--agent", "coder", "echo")

    assert took < 10 and "Traceback" not in run.stderr, run.stderr
    assert run.returncode != 0
    assert run.stderr.startswith("ctx: EFBIG: "), run.stderr
    assert f"agent/coder.d/{control} holds more than {limit} bytes" in run.stderr


@pytest.mark.parametrize(
    "command",
    [["agent", "list"], ["agent", "show", "coder"], ["policy", "explain", "coder", "tool:echo"]],
    ids=["agent list", "agent show", "policy explain"],
)
def test_readers_of_an_agent_report_its_sparse_policy_at_once(
    allowed: World, command: list[str]
) -> None:
    sparse(allowed.root / "agent/coder.d/policy")
    if command[0] == "policy":
        command = [*command, "execute"]

    took, done = bounded_ctx(allowed.root, *command)

    assert took < 10 and "Traceback" not in done.stderr, done.stderr
    said = f"agent/coder.d/policy holds more than {POLICY_LIMIT} bytes, the limit of a policy"
    assert said in done.stdout + done.stderr


@pytest.mark.parametrize("control", ["cap", "schema", "status", "name"])
def test_a_sparse_tool_control_shows_the_tool_damaged_and_refuses_its_calls(
    allowed: World, control: str
) -> None:
    sparse(allowed.root / "tool/echo.d" / control)

    took, listed = bounded_ctx(allowed.root, "object", "list", "--json")
    _, run = bounded_ctx(allowed.root, "run", "--agent", "coder", "echo")

    assert took < 10 and "Traceback" not in listed.stderr + run.stderr, listed.stderr
    echo = next(tool for tool in json.loads(listed.stdout) if tool["name"] == "echo")
    said = f"echo.d/{control} holds more than {CONTROL_LIMIT} bytes, the limit of a control"
    assert echo["status"] == "damaged" and said in echo["problems"][0], echo
    assert run.stderr.startswith("ctx: EFBIG: ") and said in run.stderr, run.stderr


def test_a_sparse_tool_policy_refuses_the_call_at_step_6(allowed: World) -> None:
    sparse(allowed.root / "tool/echo.d/policy")

    took, run = bounded_ctx(allowed.root, "run", "--agent", "coder", "echo")

    assert took < 10 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(
        f"ctx: EFBIG: step 6 (tool/model policy): tool/echo.d/policy holds more than "
        f"{POLICY_LIMIT} bytes"
    ), run.stderr


def test_bootstrap_repairs_a_sparse_core_control_at_once(world: World) -> None:
    cap = world.root / "tool/fs.stat.d/cap"
    sparse(cap)

    took, done = bounded_ctx(world.root, "bootstrap", "--json")

    assert took < 10 and done.returncode == 0, done.stderr
    assert "tool/fs.stat" in json.loads(done.stdout)["repaired"]
    assert cap.stat().st_size < CONTROL_LIMIT


@pytest.mark.parametrize(("limit", "padding"), [(POLICY_LIMIT, "policy"), (CONTROL_LIMIT, "mount")])
def test_a_control_of_its_limit_is_read_and_one_byte_more_is_refused(
    allowed: World, limit: int, padding: str
) -> None:
    path = allowed.root / "agent/coder.d" / padding
    text = path.read_text()
    fill = limit - len(text.encode())
    # A policy takes comment lines; a mount table takes spaces after its closing bracket.
    path.write_text(text + ("#" * (fill - 1) + "\n" if padding == "policy" else " " * fill))
    assert path.stat().st_size == limit

    assert allowed.run("echo", {"a": 1}).ok
    with open(path, "a") as grown:
        grown.write(" ")
    result = allowed.run("echo", {"a": 1})

    assert result.error is not None and result.error.errno == errno.EFBIG
    assert f"agent/coder.d/{padding} holds more than {limit} bytes" in result.error.message


def test_an_install_whose_control_would_pass_the_limit_is_refused(world: World) -> None:
    """A compact schema of 1 MiB is more once indented as installed: refused, not installed
    as a tool every reader would call damaged."""
    properties = {f"p{number:06}": {"type": "string"} for number in range(30000)}
    schema = {"type": "object", "properties": properties}
    program = world.scratch / "big.program"
    program.write_text(ECHO)
    manifest = world.scratch / "big.json"
    document = {"manifest": 2, "kind": "tool", "name": "big", "description": "big schema"}
    document |= {"schema": schema, "cap": {}, "exec": str(program)}
    manifest.write_text(json.dumps(document, separators=(",", ":")))

    checked = ctx(world.root, "object", "check", str(manifest), "--json")
    done = ctx(world.root, "object", "install", "--tier", "system", str(manifest))

    # What check calls valid, install does not refuse: check says it too.
    (entry,) = json.loads(checked.stdout)
    assert checked.returncode == 1 and entry["valid"] is False, checked.stdout[:300]
    assert entry["codes"] == ["EFBIG"], entry
    assert entry["problems"][0].startswith("its schema control would hold "), entry
    assert done.returncode != 0
    assert done.stderr.startswith("ctx: EFBIG: "), done.stderr
    assert "its schema control would hold" in done.stderr and f"{CONTROL_LIMIT}" in done.stderr
    assert not (world.root / "tool/big").exists()


@pytest.mark.parametrize(
    ("entry", "change"),
    [("echo", "chown to the agent")]
    + [
        (f"echo.d/{control}", change)
        for control in ("cap", "schema", "status", "name", "description", "origin")
        for change in ("chown to the agent", "chmod 0666")
    ],
)
def test_an_executable_or_control_not_the_hosts_refuses_the_call_at_step_6(
    allowed: World, entry: str, change: str
) -> None:
    """The executable a policy grants and the controls that set it up (its cap decides
    whether it may reach the network) are the host's, as its policy and hooks are."""
    path = allowed.root / "tool" / entry
    if change == "chmod 0666":
        path.chmod(0o666)
    else:
        os.chown(path, allowed.user.uid, allowed.user.gid)

    run = ctx(allowed.root, "run", "--agent", "coder", "echo")
    explain = ctx(allowed.root, "policy", "explain", "coder", "tool:echo", "execute")

    step = f"EACCES: step 6 (tool/model policy): tool/{entry} is not host-owned: tool/{entry} "
    assert run.returncode == 126
    assert run.stderr.startswith(f"ctx: {step}"), run.stderr
    assert f"deny: {step}" in explain.stdout
    why = "the agent's own" if change.startswith("chown") else "writable by its group or by"
    assert why in run.stderr
