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

import errno
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cortexfs.agents.projection import (
    FRESH_SECONDS,
    Parts,
    RecentDecisions,
    ViewRules,
    in_root_abi,
)
from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError
from cortexfs.printable import printable


class Projection:
    """Visibility and writability of storage paths (as parts below the root) for one viewer."""

    hides_entries = False  # whether a directory may hold names this viewer is not shown

    def serves(self, uid: int) -> bool:
        """Whether a process of ``uid`` may use the mount at all (P-5 step 1).  The host's
        view is the storage root as it is, for every uid its mode bits let in."""
        return True

    def visible(self, parts: Parts) -> bool:
        return in_root_abi(parts)

    def writable(self, parts: Parts) -> bool:
        return True


class AgentProjection(Projection):
    """The projection of T-5 for one agent, decided from its host-owned controls.

    While the agent's entry or identity cannot be read (removed, renamed away, damaged, or
    caught half-written by an edit), the view is empty: its root shows no entry and nothing
    may be changed, as fail-closed as a view can be.  The daemon goes on serving, and reads
    the controls again as it would after a policy change, so the view comes back within a
    second of the repair.  A malformed label, policy or mount control already leaves a view
    that grants nothing (:class:`~cortexfs.agents.view.AgentView`)."""

    hides_entries = True

    def __init__(self, root: Path, agent: str) -> None:
        self.root = root
        self.agent = agent
        self._loaded_at = time.monotonic()  # before the read: the facts are at least this old
        # The directory the mount serves, which it holds open; the controls are read by the
        # root's path, so a view whose path comes to name another directory is empty.
        self._served = _directory_identity(root)
        # ENOENT or EACCES now, not at the first lookup: a mount starts from usable controls.
        self._view: AgentView | None = AgentView.load(root, agent)
        # The agent's uid as its identity last said: its view, empty while the identity
        # cannot be read, is still its own (an identity edited to another uid moves it).
        self._agent_uid = self._view.identity.uid
        self._tools = RecentDecisions()
        for problem in self._view.control_problems():
            # The control counts as empty, and the view shows what an empty one grants.
            _say(f"warning: agent {agent}'s view grants as if this control were empty: {problem}")

    def serves(self, uid: int) -> bool:
        """The agent's own uid, and whoever serves its view (the host administrator who
        mounted it, to see what the agent sees): a view decides for the agent, so a process
        of another uid (given the way in by ``allow_other``, which a view mounted by root
        for its agent needs) would be granted what was granted to the agent."""
        view = self.view  # read again first when it is stale
        return uid in (os.geteuid(), self._agent_uid if view is None else view.identity.uid)

    @property
    def view(self) -> AgentView | None:
        """The agent's controls, read again once they are :data:`FRESH_SECONDS` old: a rule
        added to or removed from its policy shows in the view as soon as the kernel asks
        again.  None while its entry or identity cannot be read (the view is then empty)."""
        if time.monotonic() - self._loaded_at >= FRESH_SECONDS:
            read_at = time.monotonic()
            try:
                self._require_served_root()
                view: AgentView | None = AgentView.load(self.root, self.agent)
                self._require_served_root()  # not another root's controls, read meanwhile
            except CtxError as exc:
                view = None
                if self._view is not None:
                    _say(f"warning: agent {self.agent}'s view is empty until it is repaired: {exc}")
            if view is not None and self._view is None:
                _say(f"note: agent {self.agent}'s view shows its entries again")
            self._view, self._loaded_at = view, read_at
            if view is not None:
                self._agent_uid = view.identity.uid
        return self._view

    def _require_served_root(self) -> None:
        """ENOENT unless the root's path still names the directory the mount serves: moved
        aside and replaced by another root (a new ``storage/current``), its path would lend
        the new root's grants to the old root's files."""
        if _directory_identity(self.root) != self._served:
            raise CtxError(
                errno.ENOENT,
                f"{self.root} is no longer the storage root this mount serves (it was moved "
                "or replaced); unmount it and mount the root again",
            )

    def visible(self, parts: Parts) -> bool:
        rules = self._rules()
        return not parts if rules is None else _granted(rules.visible, parts)

    def writable(self, parts: Parts) -> bool:
        rules = self._rules()
        return rules is not None and _granted(rules.writable, parts)

    def _rules(self) -> ViewRules | None:
        view = self.view  # read again first when it is stale
        if view is None:
            return None
        read_at = self._loaded_at
        return ViewRules(view, lambda tool: self._may_execute(view, tool, read_at))

    def _may_execute(self, view: AgentView, tool: str, read_at: float) -> bool:
        """Decided again once the controls the answer came from are :data:`FRESH_SECONDS` old,
        as long as the kernel keeps its own answer: a rule removed from a policy, or a tool
        made unavailable, hides the tool then, not at the next mount.  (Every control of
        ``<t>.d/`` looked up asks the same.)"""
        return self._tools.may_run(view, tool, read_at=read_at)


def _granted(decide: Callable[[Parts], bool], parts: Parts) -> bool:
    """``decide(parts)``, or False when a control it needs cannot be read (the storage root
    gone, say): the daemon answers ENOENT or EACCES for that name and goes on serving."""
    try:
        return decide(parts)
    except CtxError:
        return False


def _directory_identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of the directory ``path`` names; None when it names none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_dev, status.st_ino) if stat.S_ISDIR(status.st_mode) else None


def _say(message: str) -> None:
    """A line on the daemon's standard error: what its viewer sees changed, and why."""
    print(printable(f"ctx mount: {message}"), file=sys.stderr, flush=True)
