"""What ``/ctx`` shows an agent: the filtered projection of the storage root (SPEC T-5, F-1).

One decision with two users: the FUSE view of ``ctx mount --as AGENT``
(:mod:`cortexfs.fuse.projection`) asks it at each lookup, and the tool runner asks it for
every name of the directories it filters when it builds a tool's ``CTX_MOUNTS``
(:func:`storage_mounts`).  So what the ``fs.*`` tools reach under ``/ctx`` is what the mount
shows, by the same rules.  The host administrator's view is the storage root as it is; an
agent's shows only what passes its effective authority, decided in memory from its
host-owned controls; nothing is written to build it (T-5: no persistent copy as a side effect
of authorisation):

==========================  ==========================================================
``bin/``                    as it is
``tool/<t>``, ``<t>.d/``    only tools the agent may run: available (intact controls, status
                            ``available``, a valid ``program``: C-2) and executable for it
                            through the whole chain (P-5, P-6); ``tsh.d/`` always
``agent/<a>``, ``<a>.d/``   only the agent itself
``home/<uid>/``             only the agent's own uid
``shared/<s>/``             spaces its policy lets it read (``shared:<s> read``), and the
                            manual bundle ``cortexfs-docs``, when its uid, gid and groups
                            may list and enter them (``r-x``: X-1 counts the directory's
                            permissions)
``model/<p>/<m>``           models it may use through the whole chain (``model:<p>/<m> use``:
                            its policy and the model's own, P-5); a provider when it may use
                            one of its models
==========================  ==========================================================

Every object of the root is seen through the agent's mount of the storage root: without one
it may use (``mount:ctx read``, P-5 steps 3 and 5) only ``bin/`` and ``tool/tsh.d/``, the
terminal's own, are shown.  Anything deeper is visible when its top object is, with one
exception: the sessions of a space, the agent's own included, and those of the other agents
that run as the agent's uid and so share its home (S-1, S-6).  The root, each top directory
but ``bin``, each ``model/<p>``, each ``shared/<s>/agent/<a>/session/`` and each
``home/<uid>/agent/<a>/session/`` of another agent are the only directories whose entries are
decided name by name (:meth:`ViewRules.decides_names`);
the table below is written for a space, and holds for the other agents of the home alike
(``home/<uid>`` for ``shared/<s>``, always writable, for ``shared:<s> write``):

==========================================  ==============================================
``shared/<s>/agent/``                       every agent's directory; never changed by the
                                            agent (the runner makes it and its entries)
``shared/<s>/agent/<a>/``                   listed, and as writable as the space below, but
                                            itself never renamed or removed by the agent,
                                            the agent's own as well
``shared/<s>/agent/<a>/session/<n>/``       only with ``session:<n> read``; what is inside
                                            changed only with ``session:<n> write`` as well
                                            as ``shared:<s> write``; the directory itself
                                            never made, renamed or removed by the agent.
                                            The agent's own sessions too: a shared session
                                            is the object ``session:<n>`` of the chain
                                            whoever recorded it (S-6, F-1)
==========================================  ==============================================

The agent's own directory in its home, ``home/<uid>/agent/<self>/``, is as the home is.

Writes are allowed only below the agent's home and below spaces its policy lets it write
(``shared:<s> write``), within those limits; tools, agents and models are the host's, a
space's ``tool/`` included (its tools run under other agents' grants).  The kernel applies
the mode bits to the agent's uid on top.
"""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, NamedTuple

from cortexfs.cached import cached
from cortexfs.errors import CtxError
from cortexfs.forks import ProcessLock
from cortexfs.names import is_object_name
from cortexfs.policy import AuthorityRequest, check_authority, check_tool_execute
from cortexfs.policy.linux import permits
from cortexfs.storage import DOCS_BUNDLE, ROOT_ENTRIES
from cortexfs.tools.controls import ToolObject, read_controls, require_available

if TYPE_CHECKING:
    from cortexfs.agents.view import AgentView

Parts = Sequence[str]
SPACE_TOOLS = "tool"  # a space's tier directory (T-4)
_READ_SEARCH = 0o5  # r-x: list a directory and enter it


def in_root_abi(parts: Parts) -> bool:
    """The root shows its six entries (R-2) and nothing else, in every view."""
    return not parts or parts[0] in ROOT_ENTRIES


def may_run(view: AgentView, tool: str) -> bool:
    """Whether the agent's runner would run the system tier's ``tool``: its own policy grants
    it (the cheap half of P-6, asked first so that a root of many tools costs little), the
    tool is available (``cortexfs.tools.runner``'s test: intact controls, status
    ``available``, a ``program`` control passing C-2), and the whole chain allows it."""
    if not is_object_name(tool) or not view.allows("tool", tool, "execute"):
        return False
    candidate = ToolObject(tool, view.root / "tool")
    try:
        require_available(candidate, read_controls(candidate))
    except CtxError:
        return False
    return check_tool_execute(view.root, view.name, tool, None, facts=view.facts).allowed


# How long an answer of :func:`may_run` may be kept for showing a tool, counted from when the
# controls it was decided from were read.  The kernel keeps a lookup of the FUSE view as long
# again (fuse.mount.ENTRY_TIMEOUT), so the mount shows a granted or revoked tool within a
# second, and the tools' CTX_MOUNTS within half of one.
FRESH_SECONDS = 0.5


Key = tuple[str, str, str, str]  # storage root, agent, /workspace's source, tool


class RecentDecisions:
    """:func:`may_run` answers, each kept for :data:`FRESH_SECONDS`.

    Showing a tool costs the whole chain for it, and a tool's ``CTX_MOUNTS`` show every tool
    the agent may run: asked afresh at every call, a worker draining a queue would run the
    chain once for each tool the agent may run per job, not once.  Only what the view *shows*
    is kept: the call's own tool is admitted by the chain at every call, however recent the
    answer kept here.  Answers are kept per storage root, agent and ``/workspace`` (all that
    names the view asked for), and only for names that can be tools; stale answers are
    dropped as others are added, so a long-lived viewer (the FUSE daemon) keeps no more than
    :data:`FRESH_SECONDS`' worth.  Threads may ask at once (a worker's job slots share one):
    they may decide the same answer twice, and only the keeping is serialised."""

    _TIDY_AT = 1024  # entries kept before the stale ones are first dropped

    def __init__(self) -> None:
        self._answers: dict[Key, tuple[float, bool]] = {}
        self._tidy_at = self._TIDY_AT
        self._keeping = ProcessLock()  # the runner is called from threads and forks (T-3)

    def may_run(self, view: AgentView, tool: str, read_at: float | None = None) -> bool:
        """:func:`may_run`, or its answer kept from less than :data:`FRESH_SECONDS` ago.
        ``read_at``: when ``view``'s controls were read (``time.monotonic()``), when that was
        before this call — an answer is as old as what it was decided from."""
        if not is_object_name(tool):
            return False  # no tool: nothing to decide, nothing to keep
        workspace = "" if view.workspace is None else str(view.workspace.source)
        key = (os.fspath(view.root), view.name, workspace, tool)
        now = time.monotonic()
        decided = self._answers.get(key)
        if decided is None or now - decided[0] >= FRESH_SECONDS:
            decided = (now if read_at is None else min(now, read_at), may_run(view, tool))
            with self._keeping:
                self._keep(key, decided, now)
        return decided[1]

    def _keep(self, key: Key, decided: tuple[float, bool], now: float) -> None:
        if len(self._answers) >= self._tidy_at:
            self._answers = {
                kept: answer
                for kept, answer in self._answers.items()
                if now - answer[0] < FRESH_SECONDS
            }
            # Twice what is still fresh: dropping costs one pass per as many additions,
            # however many names a viewer asks about in a second.
            self._tidy_at = max(self._TIDY_AT, 2 * len(self._answers))
        self._answers[key] = decided


class ViewRules:
    """The projection's answers for one agent's controls, for storage paths given as parts
    below the root.  ``may_execute`` answers for a system tool, asked once per tool for the
    life of these rules (``<t>`` and ``<t>.d/`` ask the same; the rules are made for one
    lookup, or one call's ``CTX_MOUNTS``): by default :func:`may_run`; the FUSE view and the
    runner pass :meth:`RecentDecisions.may_run`, which decides again once its answer is a
    second old."""

    def __init__(self, view: AgentView, may_execute: Callable[[str], bool] | None = None):
        self.view = view
        self.may_execute = functools.cache(may_execute or functools.partial(may_run, view))

    def visible(self, parts: Parts) -> bool:
        if not in_root_abi(parts):
            return False
        if len(parts) < 2:
            return True
        top, name = parts[0], parts[1]
        if top == "bin" or (top, name) == ("tool", "tsh.d"):
            return True  # the terminal's own programs and its configuration
        if not self.sees_storage_root:
            return False
        if top == "tool":
            return self.may_execute(name.removesuffix(".d"))
        if top == "agent":
            return name.removesuffix(".d") == self.view.name
        if top == "home":
            return name == str(self.view.identity.uid) and self._session_visible(parts)
        if top == "shared":
            space_readable = name == DOCS_BUNDLE or self.view.allows("shared", name, "read")
            return space_readable and self._may_enter_space(name) and self._session_visible(parts)
        if top == "model":
            if len(parts) < 3:
                return any(self._may_use(name, model) for model in self._models_of(name))
            return self._may_use(name, parts[2].removesuffix(".d"))
        return False

    def writable(self, parts: Parts) -> bool:
        """Whether ``parts`` may be changed: only what lies below a top object that is
        :meth:`writable_below` (the root ABI and its top objects are the host's), and in a
        space's ``agent/`` only what the table of this module allows."""
        if len(parts) < 3 or not self.writable_below(parts[:2]) or not self.visible(parts):
            return False
        if parts[0] == "shared" and parts[2] == SPACE_TOOLS:
            return False  # the host's: code other agents run under their grants
        if parts[2] == "agent":
            return self._agents_entry_writable(parts[:2], parts[3:])
        return True

    def writable_below(self, parts: Parts) -> bool:
        """Whether what lies below the top object ``parts`` (``(top, name)``) may be changed:
        the agent's home, and the spaces its policy lets it write."""
        if len(parts) != 2 or not self.visible(parts):
            return False
        top, name = parts
        if top == "shared" and name == DOCS_BUNDLE:
            return False  # the manuals are read-only documents, whatever a policy says (D-1)
        return top == "home" or (top == "shared" and self.view.allows("shared", name, "write"))

    def session_writable(self, place: Parts, session: str) -> bool:
        """Whether what lies in session ``session`` of an agent of ``place`` (a space, or the
        agent's home) that keeps its sessions by the rules may be changed: the place and the
        session are both granted for writing (S-6, X-1)."""
        return self.writable_below(place) and self.view.allows("session", session, "write")

    def keeps_sessions(self, parts: Parts) -> bool:
        """Whether ``parts`` is an agent's directory whose sessions show and change only as the
        session rules say (S-6): ``shared/<s>/agent/<a>`` of every agent, this one included
        (a shared session is the chain's object ``session:<n>`` whoever records in it, so
        the view decides as ``ctx policy explain`` does), and ``home/<uid>/agent/<a>`` of
        each other agent (agents that share a uid share its home; the agent's own home
        sessions are its uid's tier)."""
        return (
            len(parts) == 4
            and parts[2] == "agent"
            and (parts[0] == "shared" or (parts[0] == "home" and parts[3] != self.view.name))
        )

    def decides_names(self, parts: Parts) -> bool:
        """Whether the entries of directory ``parts`` are visible name by name; below any other
        directory, an entry is visible exactly when the directory is."""
        if not parts:
            return True
        if len(parts) == 1:
            return parts[0] != "bin"
        if len(parts) == 5:
            return self.keeps_sessions(parts[:4]) and parts[4] == "session"
        return len(parts) == 2 and parts[0] == "model"

    @cached
    def sees_storage_root(self) -> bool:
        """Whether the agent may use a mount of the storage root: without one, no object of
        the root passes its authority (P-5 steps 3 and 5), so none is shown (F-1, X-1)."""
        return self.view.sees_storage_root()

    def _may_enter_space(self, space: str) -> bool:
        """Whether the agent's uid, gid and groups may list and enter ``shared/<space>`` (P-5
        step 2): X-1 makes the directory's permissions part of a space's visibility, so a
        space the kernel would keep the agent out of is not listed either, nor a symbolic link
        in a space's place, which the chain refuses whatever it names."""
        return self._may_enter(("shared", space))

    def _may_enter(self, parts: Parts) -> bool:
        """Whether ``parts`` is a directory (never a link to one: the chain follows none, P-5
        step 2) that the agent's uid, gid and groups may list and enter."""
        try:
            status = os.lstat(self.view.root.joinpath(*parts))
        except OSError:
            return False
        return stat.S_ISDIR(status.st_mode) and permits(status, self.view.identity, _READ_SEARCH)

    def _session_visible(self, parts: Parts) -> bool:
        """Below an agent's ``session/`` in a space, or another agent's in the home it shares,
        a session shows only to an agent its policy lets read it (``session:<n> read``, S-6)
        and whose uid, gid and groups may list and enter its directory (P-5 step 2, as
        ``ctx policy explain`` judges it); the space's grant, or the uid, is not enough."""
        if len(parts) < 6 or not self.keeps_sessions(parts[:4]) or parts[4] != "session":
            return True
        return self.view.allows("session", parts[5], "read") and self._may_enter(parts[:6])

    def _agents_entry_writable(self, place: Parts, below: Parts) -> bool:
        """Whether ``<place>/agent/<below…>`` may be changed, in a space the agent may write or
        in its home.  ``agent/``, each agent directory that keeps sessions by the rules, its
        ``session/`` and each session directory in it are never changed by the agent: a
        rename of any of them would carry sessions out from under the rule that decides
        them; what a session holds changes with ``session:<n> write``."""
        if not below:
            return False
        agent, rest = below[0], below[1:]
        if not self.keeps_sessions((*place, "agent", agent)):
            return True  # the agent's own directory in its home
        if not rest:
            return False
        if rest[0] != "session":
            return True
        return len(rest) >= 3 and self.session_writable(place, rest[1])

    def _may_use(self, provider: str, model: str) -> bool:
        # The agent's own policy first: the cheap half, which denies most models of a root.
        name = f"{provider}/{model}"
        if not self.view.allows("model", name, "use"):
            return False
        request = AuthorityRequest(self.view.root, self.view.name, "model", name, "use")
        return check_authority(request, self.view.facts).allowed

    def _models_of(self, provider: str) -> list[str]:
        try:
            return os.listdir(self.view.root / "model" / provider)
        except OSError:
            return []


class ViewMount(NamedTuple):
    """One entry of a tool's ``CTX_MOUNTS``: the host directory ``source`` appears at
    ``target``, writable or not; ``names``, when given, are the only entries directly below
    ``target`` the agent may see (a filtered mount)."""

    source: PurePosixPath
    target: PurePosixPath
    writable: bool
    names: tuple[str, ...] | None = None

    def to_json(self) -> list[object]:
        entry: list[object] = [str(self.source), str(self.target), "rw" if self.writable else "ro"]
        if self.names is not None:
            entry.append(list(self.names))
        return entry


def storage_mounts(
    view: AgentView,
    source: PurePosixPath,
    target: PurePosixPath,
    may_execute: Callable[[str], bool] | None = None,
) -> list[ViewMount]:
    """The agent's projection of its storage root (``source``, as its mount control names
    it) as mounts at ``target`` (``/ctx``).

    Each directory whose entries the rules decide name by name (:meth:`ViewRules.decides_names`)
    is a read-only mount listing the names it shows; each top object the agent may write below
    (its home, a writable space) is a read-write mount of its own on top, with the space's
    ``tool/`` read-only on top of that.  Inside each visible space, :func:`_agents_mounts` adds
    what keeps the other agents' sessions as the rules say.
    Decided now, from the controls as they are (a policy change shows at the next call), but
    for which system tools it shows when ``may_execute`` keeps its answers (see
    :class:`ViewRules`); and only from reading them: nothing is written to build it.
    """
    rules = ViewRules(view, may_execute)
    root = PurePosixPath(source)
    mounts: list[ViewMount] = []
    spaces: tuple[str, ...] = ()
    pending: list[tuple[str, ...]] = [()]
    while pending:
        parts = pending.pop(0)
        directory = root.joinpath(*parts)
        names = _shown(rules, directory, parts)
        mounts.append(ViewMount(directory, target.joinpath(*parts), False, names))
        if parts == ("shared",):
            spaces = names
        for name in names:
            child = (*parts, name)
            if rules.decides_names(child):
                pending.append(child)
            elif rules.writable_below(child) and _is_directory(directory / name):
                mounts.append(ViewMount(directory / name, target.joinpath(*child), True))
    for space in spaces:
        tools = ("shared", space, SPACE_TOOLS)
        if rules.writable_below(tools[:2]) and _is_directory(root.joinpath(*tools)):
            mounts.append(ViewMount(root.joinpath(*tools), target.joinpath(*tools), False))
        mounts += _agents_mounts(rules, root, target, ("shared", space))
    # Agents that run as one uid share its home: each other one's sessions there are kept as
    # a space's are.
    mounts += _agents_mounts(rules, root, target, ("home", str(view.identity.uid)))
    return mounts


def _agents_mounts(
    rules: ViewRules, root: PurePosixPath, target: PurePosixPath, place: tuple[str, str]
) -> list[ViewMount]:
    """The mounts that show ``<place>/agent/`` (a space's, or the home's) as the rules do, on
    top of the place's own mount.  The top of a mount is never written through it, so in a
    writable place ``agent/`` and each agent directory that keeps its sessions by the rules
    (:meth:`ViewRules.keeps_sessions`) are mounts of their own
    (read-write, like the place: only their tops are pinned); each such agent's ``session/``
    is a read-only mount listing the sessions the agent may read, and each of those it may
    write is a read-write mount on top.  Only places the agent may read get entries, and only
    for directories that exist: ``CTX_MOUNTS`` is one environment variable."""
    agents = (*place, "agent")
    agents_directory = root.joinpath(*agents)
    if not rules.visible(place) or not _is_directory(agents_directory):
        return []
    writable_space = rules.writable_below(place)

    def mount(
        parts: tuple[str, ...], writable: bool, names: tuple[str, ...] | None = None
    ) -> ViewMount:
        return ViewMount(root.joinpath(*parts), target.joinpath(*parts), writable, names)

    mounts = [mount(agents, True)] if writable_space else []
    try:
        entries = sorted(os.listdir(agents_directory))
    except OSError:
        return mounts
    for name in entries:
        agent = (*agents, name)
        if not rules.keeps_sessions(agent) or not _is_directory(root.joinpath(*agent)):
            continue
        if writable_space:
            mounts.append(mount(agent, True))
        sessions = (*agent, "session")
        if not rules.decides_names(sessions) or not _is_directory(root.joinpath(*sessions)):
            continue
        shown = _shown(rules, root.joinpath(*sessions), sessions)
        mounts.append(mount(sessions, False, shown))
        for session in shown:
            at = (*sessions, session)
            if rules.session_writable(place, session) and _is_directory(root.joinpath(*at)):
                mounts.append(mount(at, True))
    return mounts


def _shown(rules: ViewRules, directory: PurePosixPath, parts: tuple[str, ...]) -> tuple[str, ...]:
    """The names in ``directory`` (at ``parts`` below the root) that the rules show."""
    try:
        names = os.listdir(directory)
    except OSError:
        return ()  # nothing to show: a missing or unreadable directory lists nothing
    return tuple(sorted(name for name in names if rules.visible((*parts, name))))


def _is_directory(path: PurePosixPath) -> bool:
    """A directory itself, not a link to one: a mount's source is opened without following a
    link at its end, so a link stays refused as the tools refuse every link."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
