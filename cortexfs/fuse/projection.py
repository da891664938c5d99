"""What a mount shows its viewer (SPEC T-5, F-1): the host's view, or an agent's projection.

The host administrator's view is the storage root as it is (the six entries of R-2).  An
agent's view is the projection of :mod:`cortexfs.agents.projection`, whose table says what it
shows; this module asks those rules at each lookup and keeps each answer no longer than the
kernel keeps its own (half a second each), so a policy change shows within a second.  The
tools' ``CTX_MOUNTS`` are built from the same rules, so ``ctx mount --as AGENT`` and the
agent's ``fs.*`` tools see the same names.  The kernel then applies the mode bits to the
calling uid on top (``default_permissions``).
"""

from __future__ import annotations

import time
from pathlib import Path

from cortexfs.agents.projection import (
    FRESH_SECONDS,
    Parts,
    RecentDecisions,
    ViewRules,
    in_root_abi,
)
from cortexfs.agents.view import AgentView


class Projection:
    """Visibility and writability of storage paths (as parts below the root) for one viewer."""

    hides_entries = False  # whether a directory may hold names this viewer is not shown

    def visible(self, parts: Parts) -> bool:
        return in_root_abi(parts)

    def writable(self, parts: Parts) -> bool:
        return True


class AgentProjection(Projection):
    """The projection of T-5 for one agent, decided from its host-owned controls."""

    hides_entries = True

    def __init__(self, root: Path, agent: str) -> None:
        self.root = root
        self.agent = agent
        self._loaded_at = time.monotonic()  # before the read: the facts are at least this old
        self._view = AgentView.load(root, agent)  # ENOENT now, not at the first lookup
        self._tools = RecentDecisions()

    @property
    def view(self) -> AgentView:
        """The agent's controls, read again once they are :data:`FRESH_SECONDS` old: a rule
        added to or removed from its policy shows in the view as soon as the kernel asks
        again."""
        if time.monotonic() - self._loaded_at >= FRESH_SECONDS:
            read_at = time.monotonic()
            self._view = AgentView.load(self.root, self.agent)
            self._loaded_at = read_at
        return self._view

    def visible(self, parts: Parts) -> bool:
        return ViewRules(self.view, self._may_execute).visible(parts)

    def writable(self, parts: Parts) -> bool:
        return ViewRules(self.view, self._may_execute).writable(parts)

    def _may_execute(self, tool: str) -> bool:
        """Decided again once the controls the answer came from are :data:`FRESH_SECONDS` old,
        as long as the kernel keeps its own answer: a rule removed from a policy, or a tool
        made unavailable, hides the tool then, not at the next mount.  (Every control of
        ``<t>.d/`` looked up asks the same.)"""
        view = self.view  # read again first when it is stale
        return self._tools.may_run(view, tool, read_at=self._loaded_at)
