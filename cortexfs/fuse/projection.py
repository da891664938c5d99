"""What ``/ctx`` shows an agent: the filtered projection of the storage root (SPEC T-5, F-1).

The host administrator's view is the storage root as it is.  An agent's view shows only what
passes its effective authority, decided in memory each time a name is looked up; nothing is
written to build it (T-5: no persistent copy as a side effect of authorisation):

==========================  ==========================================================
``bin/``                    as it is
``tool/<t>``, ``<t>.d/``    only tools the agent may run: available (intact controls, status
                            ``available``, a valid ``program``: C-2) and executable for it
                            through the whole chain (P-5, P-6); ``tsh.d/`` always
``agent/<a>``, ``<a>.d/``   only the agent itself
``home/<uid>/``             only the agent's own uid
``shared/<s>/``             spaces its policy lets it read (``shared:<s> read``), and the
                            manual bundle ``cortexfs-docs``
``model/<p>/<m>``           models its policy lets it use (``model:<p>/<m> use``)
==========================  ==========================================================

Anything deeper is visible when its top object is.  Writes are allowed only in the agent's
home and in spaces its policy lets it write (``shared:<s> write``); tools, agents and models
are the host's.  The kernel then applies the mode bits to the agent's uid on top
(``default_permissions``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError
from cortexfs.names import is_object_name
from cortexfs.policy import check_tool_execute
from cortexfs.storage import DOCS_BUNDLE, ROOT_ENTRIES
from cortexfs.tools.controls import ToolObject, read_controls, require_available

Parts = Sequence[str]
FRESH_SECONDS = 1.0  # as long as the kernel may keep an answer (mount.ENTRY_TIMEOUT)


class Projection:
    """Visibility and writability of storage paths (as parts below the root) for one viewer."""

    def visible(self, parts: Parts) -> bool:
        return not parts or parts[0] in ROOT_ENTRIES

    def writable(self, parts: Parts) -> bool:
        return True


class AgentProjection(Projection):
    """The projection of T-5 for one agent, decided from its host-owned controls."""

    def __init__(self, root: Path, agent: str) -> None:
        self.root = root
        self.agent = agent
        self._view = AgentView.load(root, agent)  # ENOENT now, not at the first lookup
        self._loaded_at = time.monotonic()
        self._tools: dict[str, tuple[float, bool]] = {}  # tool -> (when decided, may run)

    @property
    def view(self) -> AgentView:
        """The agent's controls, read again once they are a second old: a rule added to or
        removed from its policy shows in the view as soon as the kernel asks again."""
        if time.monotonic() - self._loaded_at >= FRESH_SECONDS:
            self._view = AgentView.load(self.root, self.agent)
            self._loaded_at = time.monotonic()
        return self._view

    def visible(self, parts: Parts) -> bool:
        if not super().visible(parts):
            return False
        if len(parts) < 2:
            return True
        top, name = parts[0], parts[1]
        if top == "bin":
            return True
        if top == "tool":
            return name == "tsh.d" or self._may_execute(name.removesuffix(".d"))
        if top == "agent":
            return name.removesuffix(".d") == self.agent
        if top == "home":
            return name == str(self.view.identity.uid)
        if top == "shared":
            return name == DOCS_BUNDLE or self.view.allows("shared", name, "read")
        if top == "model":
            if len(parts) < 3:
                return any(self._may_use(name, model) for model in self._models_of(name))
            return self._may_use(name, parts[2].removesuffix(".d"))
        return False

    def writable(self, parts: Parts) -> bool:
        if not self.visible(parts) or len(parts) < 3:
            return False  # the root ABI and its top objects are the host's
        if parts[0] == "home":
            return True
        return parts[0] == "shared" and self.view.allows("shared", parts[1], "write")

    def _may_execute(self, tool: str) -> bool:
        """Decided again once the answer is a second old, as long as the kernel keeps its
        own: a rule removed from a policy, or a tool made unavailable, hides the tool then,
        not at the next mount.  (Every control of ``<t>.d/`` looked up asks the same.)"""
        if not is_object_name(tool):
            return False
        now = time.monotonic()
        decided = self._tools.get(tool)
        if decided is None or now - decided[0] >= FRESH_SECONDS:
            decided = (now, self._available(tool) and self._allowed(tool))
            self._tools[tool] = decided
        return decided[1]

    def _available(self, tool: str) -> bool:
        """The runner's test (``cortexfs.tools.runner``): controls intact and status
        ``available`` — a ``program`` control failing C-2 makes it ``unavailable``."""
        candidate = ToolObject(tool, self.root / "tool")
        try:
            require_available(candidate, read_controls(candidate))
        except CtxError:
            return False
        return True

    def _allowed(self, tool: str) -> bool:
        return check_tool_execute(self.root, self.agent, tool, None).allowed

    def _may_use(self, provider: str, model: str) -> bool:
        return self.view.allows("model", f"{provider}/{model}", "use")

    def _models_of(self, provider: str) -> list[str]:
        try:
            return [entry.name for entry in (self.root / "model" / provider).iterdir()]
        except OSError:
            return []
