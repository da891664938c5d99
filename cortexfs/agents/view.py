"""An agent as the tool runtime sees it: identity, label, policy, mounts, CTX_PATH (A-3, T-4, T-5).

Everything here comes from the agent's host-owned controls (``agent/<name>.d/``), read through
:mod:`cortexfs.policy.controls`; nothing comes from a request, a prompt or a model (P-6).  A
view is made for one call or one lookup, and the authority chain's questions asked on its
behalf share its :class:`~cortexfs.policy.AgentFacts`, so the controls are read once per view
however many tools the projection asks about.  The view derives what the runtime injects into
a tool process:

* ``CTX_PATH`` — ``/ctx/tool``, ``/ctx/home/<uid>/tool``, then ``/ctx/shared/<space>/tool`` for
  every space its policy lets it read (``shared:<space> read``), in name order;
* ``CTX_MOUNTS`` — the mounts its policy lets it use: a mount is visible with ``mount:<name>
  read`` and writable only when it is ``rw`` *and* the policy holds ``mount:<name> write``.
  Two mounts sharing a name are both withheld (a policy rule could not tell them apart).  The
  storage root's own mount (``/ctx``) is never passed raw: it becomes the agent's projection
  of it (:func:`cortexfs.agents.projection.storage_mounts`), filtered mounts that show what
  ``ctx mount --as AGENT`` shows and are writable where that view is;
* ``CTX_CWD`` — ``/workspace`` when visible (A-1), else the first visible mount other than
  ``/ctx``, else the agent's home under ``/ctx`` (or ``/ctx`` itself until the home exists),
  else ``/``.

One thing comes from the host administrator instead, for one terminal only: the directory
``ctx agent start`` was run from (or ``--workspace DIR``) is the agent's read-write
``/workspace`` (A-1), unless the mount control lists a ``/workspace`` of its own, which wins.
:meth:`AgentView.with_workspace` adds it to the view of that terminal and of the tools it runs;
it is never written to the agent's controls.

A malformed label, policy or mount control counts as empty here, each on its own
(:meth:`AgentView.control_problems` says why); the authority chain, which every call goes
through, denies such an agent and says why.  So does a policy the agent, or a uid other than
the host's, could rewrite (step 4 of the chain): a grant it could give itself is no grant, in
its view as in its calls.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import pwd
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs.agents.projection import ViewMount, storage_mounts
from cortexfs.errors import CtxError
from cortexfs.names import check_object_name
from cortexfs.policy import AgentFacts, Identity, Policy
from cortexfs.policy import controls as agent_controls
from cortexfs.policy.linux import permits
from cortexfs.policy.mounts import Mount, granted_mounts
from cortexfs.storage import DOCS_BUNDLE
from cortexfs.tools.ctxpath import CTX_MOUNT, Resolution, search_path, which
from cortexfs.tools.spawn import MAX_ARG_STRLEN

WORKSPACE = PurePosixPath("/workspace")
# The grants whose objects each take an entry of CTX_MOUNTS (the view lists them one by one).
_LISTED_IN_VIEW = (("tool", "execute"), ("model", "use"))
_LIST_AND_ENTER = 0o5  # r-x: the permission bits that let a uid list a directory and enter it
TOOL_SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"


class AgentView(NamedTuple):
    root: Path
    name: str
    identity: Identity
    label: str
    policy: Policy
    mounts: tuple[Mount, ...]
    facts: AgentFacts  # the chain's reading of the same controls, shared by the view's questions
    workspace: Mount | None = None  # the terminal's default /workspace, not a control

    @classmethod
    def load(cls, root: Path, name: str) -> AgentView:
        """ENOENT when the agent does not exist, EACCES when its identity is unusable."""
        check_object_name(name, "agent")
        facts = AgentFacts(root, name)
        try:
            identity = facts.declared_identity  # read once for the view and the chain's step 1
        except CtxError as exc:
            if exc.errno != errno.ENOENT or not os.path.islink(root / "agent"):
                raise
            # Not "agent/NAME does not exist", which it may through the link: say why it is
            # no agent of this root.  (Imported here, for a refusal only: the entries' module
            # brings the installer's, which no call of a tool needs.)
            from cortexfs.agents.entries import linked_agents_directory

            raise CtxError(
                errno.ENOENT,
                f"there is no agent {name!r} in {root}: {linked_agents_directory(root / 'agent')}",
            ) from None
        label, policy, mounts = "", Policy(), ()
        with contextlib.suppress(CtxError):
            label = facts.declared_label
        with contextlib.suppress(CtxError):
            policy = facts.granting_policy()
        with contextlib.suppress(CtxError):
            mounts = facts.mounts
        return cls(root, name, identity, label, policy, mounts, facts)

    def control_problems(self) -> list[str]:
        """Why a label, policy or mount control of the agent is unusable (each then counts
        as empty here, and the authority chain denies with the same reason)."""
        problems: list[str] = []
        for read in (
            lambda: self.facts.declared_label,
            lambda: self.facts.policy(agent_controls.control_path(self.name, "policy")),
            lambda: self.facts.mounts,
            # Step 4, judged whatever the label: a policy the agent could rewrite grants
            # nothing, and an administrator told of both fixes both at once.
            self.facts.require_host_owned_controls,
        ):
            try:
                read()
            except CtxError as exc:
                if exc.message not in problems:  # the mount table, read again by step 4
                    problems.append(exc.message)
        return problems

    def with_workspace(self, directory: Path | None) -> AgentView:
        """This view with ``directory`` as its read-write ``/workspace`` (A-1's default), or
        unchanged when there is none or the mount control lists a ``/workspace`` itself."""
        if directory is None or any(mount.target == WORKSPACE for mount in self.mounts):
            return self
        source = PurePosixPath(os.path.realpath(directory))
        return self._replace(workspace=Mount(source, WORKSPACE, True))

    def allows(self, object_class: str, object_name: str, permission: str) -> bool:
        return bool(self.label) and self.policy.allows(
            self.label, object_class, object_name, permission
        )

    def readable_spaces(self) -> list[str]:
        return self.spaces_granted("read")

    def _granted(self, object_class: str, permission: str) -> int:
        """How many objects of ``object_class`` this agent's policy grants ``permission`` on."""
        return len(
            {
                rule.object_name
                for rule in self.policy
                if rule.subject == self.label
                and rule.object_class == object_class
                and rule.permission == permission
            }
        )

    def spaces_granted(self, permission: str) -> list[str]:
        return sorted(
            rule.object_name
            for rule in self.policy
            if rule.subject == self.label
            and rule.object_class == "shared"
            and rule.permission == permission
        )

    def too_big_to_start(self, environment: Mapping[str, str]) -> CtxError | None:
        """E2BIG naming what to shrink when the kernel would start no program with
        ``environment`` (a tool's, tsh's): ``CTX_PATH`` or ``CTX_MOUNTS`` over the bytes it
        passes in one variable; None when both fit.  Said before the start, where the
        kernel's refusal would name neither the variable nor the grants behind it."""
        for name in ("CTX_PATH", "CTX_MOUNTS"):
            if name not in environment:
                continue
            size = len(os.fsencode(f"{name}={environment[name]}"))
            if size < MAX_ARG_STRLEN:
                continue
            policy = f"agent/{self.name}.d/policy"
            if name == "CTX_PATH":
                spaces = spaces_with_tiers(self.readable_spaces())
                missing = sum(not (self.root / "shared" / s).is_dir() for s in spaces)
                why = (
                    f"it lists {CTX_MOUNT}/shared/<space>/tool for each of the {len(spaces)} "
                    f"spaces its policy lets it read (shared:<space> read, {missing} of them "
                    f"spaces that do not exist): remove from {policy} the grants it does not need"
                )
            else:
                written = len(self.spaces_granted("write"))
                tools, models = (self._granted(kind, perm) for kind, perm in _LISTED_IN_VIEW)
                why = (
                    f"it lists the agent's {len(self.mounts)} mounts and its view of "
                    f"{CTX_MOUNT}: an entry for each of the {tools} tools and {models} models "
                    f"its policy grants, two or three for each of the {written} spaces it may "
                    f"write: give it fewer mounts (agent/{self.name}.d/mount), or fewer "
                    f"writable spaces, tools or models ({policy})"
                )
            return CtxError(
                errno.E2BIG,
                f"agent {self.name}'s {name} is {size} bytes, more than the {MAX_ARG_STRLEN} "
                f"the kernel passes a program in one variable; {why}",
            )
        return None

    def ctx_path(self) -> str:
        """The runtime-injected ``CTX_PATH`` of this agent, in view terms (T-4: derived from
        policy, mounts and uid/gid): of the spaces its policy lets it read, those its view
        shows, the directories its uid, gid and groups may list and enter (X-1).  A link in
        a space's place (``shared/alias -> proj``) is no space to the chain (P-5 step 2), and
        a space regrouped away from the agent is closed to it: the tools of neither are the
        agent's to find there, before a later space's own."""
        return agent_ctx_path(self.identity.uid, self._spaces_on_path(open_to_agent=True))

    def _spaces_on_path(self, *, open_to_agent: bool) -> list[str]:
        """The spaces the policy lets the agent read that its uid, gid and groups may enter
        (``open_to_agent``), or those they may not."""
        return [s for s in self.readable_spaces() if self._may_enter_space(s) == open_to_agent]

    def _may_enter_space(self, space: str) -> bool:
        try:
            status = os.lstat(self.root / "shared" / space)
        except OSError:
            return True  # not there (yet): on the path as granted, found empty
        return stat.S_ISDIR(status.st_mode) and permits(status, self.identity, _LIST_AND_ENTER)

    def tool_directories(self) -> tuple[Path, ...]:
        return search_path(self.root, self.ctx_path(), "agent", agent_view=True).directories

    def find_tool(self, name: str) -> Resolution | None:
        """``name`` as a call of this agent finds it: on its ``CTX_PATH`` (T-4); else, as
        ``execvp`` answers for a directory it could not search, in a space the policy grants
        but the agent's ids may not enter (a real space only, never a link in its place), so
        that the chain refuses the call at step 2 naming the space (EACCES) rather than
        saying no such tool exists; None when neither holds it."""
        found = which(name, self.tool_directories())
        if found is not None:
            return found
        closed = spaces_with_tiers(self._spaces_on_path(open_to_agent=False))
        places = [self.root / "shared" / space for space in closed]
        return which(name, [place / "tool" for place in places if not place.is_symlink()])

    def visible_mounts(self) -> list[Mount]:
        """The mounts a tool of this agent may use, writable only where the policy says so."""
        visible = granted_mounts(self.mounts, functools.partial(self.allows, "mount"))
        if self.workspace is not None:
            visible.append(self.workspace)  # granted by the host starting the terminal
        return visible

    def tool_mounts(self, may_execute: Callable[[str], bool] | None = None) -> list[ViewMount]:
        """The mounts a tool process gets (``CTX_MOUNTS``): :meth:`visible_mounts`, with a
        mount of the storage root itself replaced by the agent's projection of it (T-5), so
        that a tool reaches under ``/ctx`` what ``ctx mount --as AGENT`` shows, no more.
        ``may_execute`` decides which system tools the projection shows (see
        :func:`~cortexfs.agents.projection.storage_mounts`)."""
        mounts = []
        for mount in self.visible_mounts():
            if self._shows_storage_root(mount):
                mounts += storage_mounts(self, mount.source, mount.target, may_execute)
            else:
                mounts.append(ViewMount(mount.source, mount.target, mount.writable))
        return mounts

    def working_directory(self) -> tuple[PurePosixPath, Path]:
        """The view path a tool starts in and the host directory behind it: ``/workspace``,
        else the first visible mount other than the storage root's, else, for an agent that
        sees only the storage root, its own home there (``/ctx/home/<uid>``, once it exists)
        or the root's mount itself; ``/`` only for an agent that sees nothing at all, where
        every path a tool resolves is refused anyway."""
        visible = self.visible_mounts()
        chosen = next((m for m in visible if m.target == WORKSPACE), None) or next(
            (m for m in visible if m.target != CTX_MOUNT), None
        )
        if chosen is not None:
            return chosen.target, Path(chosen.source)
        storage = next((m for m in visible if self._shows_storage_root(m)), None)
        if storage is None:
            return PurePosixPath("/"), Path("/")
        home = Path(storage.source, "home", str(self.identity.uid))
        if home.is_dir() and not home.is_symlink():
            return storage.target / "home" / str(self.identity.uid), home
        return storage.target, Path(storage.source)

    def sees_storage_root(self) -> bool:
        """Whether a mount this agent may use shows the storage root (its ``/ctx``): every
        object of the root is seen through it, and step 5 denies what only an ungranted mount
        shows (P-5)."""
        return any(self._shows_storage_root(mount) for mount in self.visible_mounts())

    def _shows_storage_root(self, mount: Mount) -> bool:
        """Whether ``mount`` is of the storage root itself, as the authority chain judges it:
        a mount's source is the real path it was recorded as (a source that no longer is one
        is withheld when the control is read, see :func:`~cortexfs.policy.mounts.source_problem`),
        so it is compared with the root's real path as it is, never resolved again."""
        return mount.source == self.facts.root  # both paths of the one (POSIX) flavour

    def tool_environment(
        self,
        *,
        tool: str,
        session: str,
        call: str,
        mode: str,
        may_execute: Callable[[str], bool] | None = None,
    ) -> dict[str, str]:
        """The whole environment of a tool process: nothing leaks in from the host's.
        ``may_execute`` as for :meth:`tool_mounts`."""
        cwd, _ = self.working_directory()
        mounts = [mount.to_json() for mount in self.tool_mounts(may_execute)]
        # A terminal-mode tool writes to a terminal: shells, pagers and multiplexers (H-5)
        # need to know which.
        terminal = {"TERM": terminal_type()} if mode == "terminal" else {}
        return {
            **terminal,
            "PATH": TOOL_SEARCH_PATH,
            "HOME": _home_of(self.identity.uid),
            "LANG": "C.UTF-8",
            "CTX_AGENT": self.name,
            "CTX_SESSION": session,
            "CTX_CALL": call,
            "CTX_TOOL": tool,
            "CTX_MODE": mode,
            "CTX_PATH": self.ctx_path(),
            "CTX_MOUNTS": json.dumps(mounts),
            "CTX_CWD": str(cwd),
        }


def spaces_with_tiers(readable: Iterable[str]) -> list[str]:
    """The spaces, of those an agent may read, whose ``tool/`` is on its ``CTX_PATH``: all
    but the manual bundle, which is read, never a tier: manuals grant nothing (D-1, X-2), and
    a tool/ put in it must not run for an agent that may read the manuals."""
    return [space for space in readable if space != DOCS_BUNDLE]


def agent_ctx_path(uid: int, readable: Iterable[str]) -> str:
    """The runtime-injected ``CTX_PATH`` of an agent of ``uid`` that may read the spaces
    ``readable``, in view terms (T-4): the system and home tiers, then each space's."""
    entries = [f"{CTX_MOUNT}/tool", f"{CTX_MOUNT}/home/{uid}/tool"]
    entries += [f"{CTX_MOUNT}/shared/{space}/tool" for space in spaces_with_tiers(readable)]
    return ":".join(entries)


DEFAULT_TERM = "xterm-256color"
_TERMINFO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def terminal_type() -> str:
    """The ``TERM`` given to tsh and to terminal-mode tools: the host's, when it is a plain
    terminfo name, else ``xterm-256color``."""
    term = os.environ.get("TERM", "")
    return term if _TERMINFO_NAME.fullmatch(term) else DEFAULT_TERM


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir or "/"  # an empty home field is no directory
    except KeyError:
        return "/"
