"""tsh's context of tool metadata inside a real agent terminal (SPEC H-4): running a tool
loads it, and the metadata comes from the agent's view of ``/ctx``."""

from __future__ import annotations

from tests.agents.test_terminal import Client, pytestmark, running_terminal
from tests.tools.support import World

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE


def test_running_a_tool_loads_its_metadata_into_the_context(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    config = world.root / "tool" / "tsh.d" / "config"
    config.write_text(config.read_text() + "max_loaded_tools=x\n")  # reported, then ignored
    with running_terminal(world, "coder") as facts:
        client = Client(facts["listening_at"], "attach")
        client.expect(r"coder\$ ")
        client.type("loaded")
        client.expect(r"loaded\r?\n[\s\S]*coder\$ ")
        client.type("fs.stat /workspace")
        client.expect(r"type: directory[\s\S]*coder\$ ")
        client.type("loaded")

        listed = client.expect(r"loaded\r?\n[\s\S]*loaded\r?\n[\s\S]*coder\$ ")
        client.close()

    assert "tsh.d/config:5: max_loaded_tools must be a positive integer" in listed
    before, after = listed.split("fs.stat /workspace", 1)
    assert "fs.stat: Describe one entry" not in before.split("loaded", 1)[1]
    assert "fs.stat: Describe one entry" in after.rsplit("loaded", 1)[1]
