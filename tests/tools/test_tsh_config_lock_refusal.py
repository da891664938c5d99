"""``tsh.config`` refused at the tier's lock file says so (H-4, T-8).

The update takes the lock of the tier's installs, which only the tier's owner may open: an
agent, or any other uid, is refused there even when ``tsh.d/`` and the config are writable to
it, and the refusal names the lock file, whose it is, and who may update the settings."""

from __future__ import annotations

import os
from pathlib import Path

from cortexfs.locks import LOCK_FILE
from cortexfs.tools.core import tsh_config
from tests.tools.support import World

CONFIG = Path("tool") / "tsh.d" / "config"


def test_an_agent_refused_at_the_lock_file_is_told_of_the_lock_not_of_the_config(
    world: World,
) -> None:
    world.agent("coder", tools=["tsh.config"])
    world.allow_tool("tsh.config")
    (world.root / "tool/tsh.d").chmod(0o777)
    (world.root / CONFIG).chmod(0o666)  # the config is not what refuses

    refused = world.run("tsh.config", {"set": {"cache_capacity": 35}})

    message = refused.output["message"]
    assert refused.output["error"] == "EACCES", refused.output
    lock = world.root / "tool" / LOCK_FILE
    owner = os.stat(world.root / "tool").st_uid
    assert f"{lock} cannot be opened by uid {world.user.uid}: Permission denied" in message
    assert "(it belongs to uid 0, mode 0600)" in message
    assert f"run 'ctx tool tsh.config KEY=VALUE' as the directory's owner (uid {owner})" in (
        message
    )
    assert "the configuration belongs" not in message
    assert (world.root / CONFIG).read_text() == tsh_config.DEFAULT_TEXT
