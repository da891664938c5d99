"""A space an older version made (its directory 2770, without the sticky bit): step 6 refuses
its tools, as it must (a member could rename the tool's directory away), and names the
product's repair, 'ctx shared create NAME --group G', not a chmod that would take the members'
share away."""

from __future__ import annotations

import os

import pytest

from cortexfs.shared.spaces import create_shared_space
from tests.support.cli import ctx
from tests.tools.support import World


@pytest.mark.parametrize("directory", ["", "/tool"])
def test_a_spaces_own_directory_of_an_older_mode_names_shared_create(
    world: World, directory: str
) -> None:
    create_shared_space(world.root, "proj", gid=world.user.gid)
    world.install("proj.echo", "#!/bin/sh\ncat\n", tier="shared:proj")
    world.agent("member", tools=["proj.echo"], shared={"proj": ["read"]})
    world.allow_tool("proj.echo", "member_t", location="shared/proj/tool")
    os.chmod(world.root / f"shared/proj{directory}", 0o2770)  # as an older version made it

    refused = world.run("proj.echo", {"hi": 1}, agent="member")

    assert not refused.ok and refused.error is not None and refused.error.step == 6
    message = refused.error.message
    assert f"shared/proj{directory} is writable by its group or by others (mode 2770)" in message
    assert f"run 'ctx shared create proj --group {world.user.gid}'" in message
    assert "chmod go-w" not in message

    repaired = ctx(world.root, "shared", "create", "proj", "--group", str(world.user.gid))

    assert repaired.returncode == 0, repaired.stderr
    assert world.run("proj.echo", {"hi": 1}, agent="member").ok


def test_another_loose_directory_still_names_chmod(world: World) -> None:
    world.install("loose", "#!/bin/sh\ncat\n")
    world.agent("coder", tools=["loose"])
    world.allow_tool("loose")
    os.chmod(world.root / "tool/loose.d", 0o775)

    refused = world.run("loose")

    assert not refused.ok and refused.error is not None and refused.error.step == 6
    assert "(chmod go-w)" in refused.error.message
    assert "ctx shared create" not in refused.error.message
