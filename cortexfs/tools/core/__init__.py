"""The core tools every storage root has: ``fs.read``, ``fs.list``, ``fs.stat``, ``fs.write``,
``shell.exec``, ``tsh.config``, ``agent.update`` and ``agent.create`` (SPEC R-5, A-4, A-5).

Each is a module with a ``run()`` entry point, installed by ``ctx bootstrap`` as a small
executable script in ``tool/`` (:mod:`cortexfs.tools.core.bootstrap`) from the v2 manifests in
``manifests/``.  The programs import only the standard library and the light parts of
CortexFS (:mod:`~cortexfs.tools.core.toolio`, :mod:`~cortexfs.tools.core.confine`,
:mod:`cortexfs.durable`), so a call pays for little more than the interpreter's start.
"""

CORE_TOOLS = {
    "fs.read": "fs_read",
    "fs.list": "fs_list",
    "fs.stat": "fs_stat",
    "fs.write": "fs_write",
    "shell.exec": "shell_exec",
    "tsh.config": "tsh_config",
    "agent.update": "agent_update",
    "agent.create": "agent_create",
}
# The core tools for which the runner serves a run capability (cortexfs.agents.capability).
NEEDS_CAPABILITY = ("agent.update", "agent.create")
# What ctx bootstrap installs into the system tier and puts back whenever it differs: the core
# tools and tsh (H-1).  An install of another version there would be undone by the next
# bootstrap, so ctx object install refuses these names in that tier.
BOOTSTRAP_TOOLS = (*CORE_TOOLS, "tsh")
