"""An MCP-backed tool refuses a configuration its agent could rewrite through a read-write
mount, also where StrictModes alone lets it pass: an ordinary user's agent runs as that user,
who owns the tool and the configuration, so owners and modes tell nothing.  An agent granted
``fs.write``, not ``shell.exec``, must not make the tool run a command of its choosing, with
the call offline (the host vouches for the file) or with network (the bridge judges it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.users import UnprivilegedUser

VENV_BIN = Path(sys.executable).parent
TOOL = "time.get_current_time"

needs_mcp_server_time = pytest.mark.skipif(
    not (VENV_BIN / "mcp-server-time").exists(),
    reason=f"{VENV_BIN} has no mcp-server-time (the install provides it)",
)

# coder's workspace holds its MCP configuration: read-only at /mcp, but writable at
# /workspace/mcp through the workspace.
SETUP = """
ctx bootstrap
mkdir -p mcp
cat > mcp/mcp.json <<EOF
{"mcpServers": {"time": {"command": "$(command -v mcp-server-time)"}}}
EOF
cat > request.json <<EOF
{"name": "coder", "label": "coder_t", "tools": ["fs.write"],
 "mount": [["$PWD", "/workspace", "rw"], ["$PWD/mcp", "/mcp", "ro"]]}
EOF
ctx agent create request.json
echo "allow coder_t tool:fs.write execute" >> "$(ctx object which fs.write).d/policy"
ctxmcp project --config mcp/mcp.json --runtime-config /mcp/mcp.json --server time --out out/
ctx object install out/time.get_current_time.manifest.json --tier system
"""


def as_user(
    script: str, cwd: Path, user: UnprivilegedUser, root: Path
) -> subprocess.CompletedProcess[str]:
    env = {
        "HOME": str(cwd.parent),
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "CTX_STORAGE": str(root),
    }
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@needs_mcp_server_time
@pytest.mark.parametrize("network", [False, True], ids=["offline", "with-network"])
def test_an_agent_that_may_write_its_mcp_configuration_cannot_make_the_tool_run_it(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser, network: bool
) -> None:
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    root = home / "root"
    workspace = home / "work"  # not home: the storage root is there
    workspace.mkdir()
    os.chown(workspace, unprivileged_user.uid, unprivileged_user.gid)
    made = as_user(SETUP, workspace, unprivileged_user, root)
    assert made.returncode == 0, made.stderr
    grants = [f"allow coder_t tool:{TOOL} execute\n"]
    for policy in (root / "agent/coder.d/policy", root / f"tool/{TOOL}.d/policy"):
        with open(policy, "a") as handle:
            handle.writelines(grants)
    if network:
        with open(root / "agent/coder.d/policy", "a") as handle:
            handle.write("allow coder_t network:default connect\n")
    marker = home / "ran-the-agents-command"
    command = {"command": "/bin/sh", "args": ["-c", f"touch {marker}; exit 1"]}
    written = {"mcpServers": {"time": command}}
    write = {"path": "/workspace/mcp/mcp.json", "content": json.dumps(written)}
    call = f"ctx run --agent coder fs.write '{json.dumps(write)}'\n"
    call += f'ctx run --agent coder {TOOL} \'{{"timezone": "UTC"}}\'\n'

    ran = as_user(call, workspace, unprivileged_user, root)

    assert not marker.exists(), "the tool ran the command its agent wrote"
    assert ran.returncode != 0
    assert "EACCES" in ran.stderr, ran.stderr
    assert "through its read-write mount" in ran.stderr, ran.stderr
    assert "/workspace" in ran.stderr, ran.stderr
