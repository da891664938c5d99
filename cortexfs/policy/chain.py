"""The authority chain (SPEC P-5, P-6): six steps in a fixed order; the first denial decides.

1. **peer credentials** — the asking process is the agent: the uid/gid the kernel reports for
   it (socket peer, FUSE request, exec) are the agent's identity, and that identity is not
   root (root would void step 2).  A missing agent is ENOENT.
2. **mode bits** — the agent's uid, gid and groups may reach the object and use it, by the
   Linux owner/group/other rule, through no symbolic link (:mod:`cortexfs.policy.objects` has
   the object and the bits of every class and permission).  A missing object is ENOENT.
3. **mount visibility** — the object lies under one of the agent's mounts, read-write when the
   permission writes (:mod:`cortexfs.policy.mounts`).  The agent's mount of the storage root
   is the exception: its tools get the agent's view of the root instead (T-5,
   :mod:`cortexfs.agents.projection`), which shows, of the homes and spaces, only the agent's
   own home and the spaces its policy lets it read (:meth:`AgentFacts.hidden_reason`), and is
   writable below the agent's home and below the spaces its policy lets it read and write
   (never a space's ``tool/``), whatever the mount's own mode
   (:meth:`AgentFacts.writes_through`).
4. **agent label** — the agent has a valid subject type, and none of the controls its grants
   come from (identity, mount, label, policy) is within its own reach to rewrite: like ssh's
   StrictModes, neither the control nor a directory above it (``agent/<name>.d``, ``agent``,
   the storage root) belongs to the agent's uid (unless that uid is the host administrator's,
   who owns the storage root) or is writable by its group or by others; and none is writable
   by the agent through a read-write mount.
5. **object policy** — the agent's policy allows ``<label> <class>:<name> <perm>``, and it
   grants a mount the object is seen through (``mount:<name> read``, and ``write`` to write
   through a mount other than the storage root's), the mounts its tools get.
6. **tool/model policy** — a tool's or model's own policy allows the same rule: the second
   layer of P-6.  Other classes have no policy of their own.  That policy file, and a tool's
   executable, its other controls (:data:`~cortexfs.policy.objects.TOOL_CONTROLS`) and its
   hooks are held to step 4's rule: nobody but the host may change them (the agent's own uid
   may own a post-hook it runs, not a pre-hook, which guards its calls, nor the executable:
   the grant is for the tool the host installed, not for whatever code the agent puts there).

A request names an agent, an object and a permission, nothing more: the label and every rule
come from host-owned files, so a prompt or a model's output has no way in (P-6).  Every step
fails closed: a control that cannot be read denies with EACCES.  That is a verdict on the agent
only when the process reading is root or runs as the agent's uid: one of another uid (a user
explaining another's agent) meets refusals of its own, which say nothing of the agent, so it
gets no verdict but an EACCES error naming what it may not reach
(:func:`refusal_of_this_process`).

Steps 1 and 4, and the reading of step 3's mounts and step 5's policy, depend on the agent
alone.  Whoever asks about many objects at once (the projection of ``/ctx`` asks about every
tool the agent's policy grants, at every call) passes one :class:`AgentFacts`, so that the
agent's controls are read and judged once for all of them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from enum import IntEnum, StrEnum
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs.beneath import (
    Entry,
    walk,
    walk_to_each,
    walk_to_listings,
    walk_with_children,
)
from cortexfs.cached import cached
from cortexfs.errors import HOST_SHORTAGES, CtxError, denied, not_found
from cortexfs.names import check_object_name
from cortexfs.policy import controls
from cortexfs.policy.decision import Policy
from cortexfs.policy.grammar import Rule, check_object
from cortexfs.policy.linux import WRITE, Credentials, Identity, Kind, check_access, writable_on_walk
from cortexfs.policy.mounts import (
    CTX_TARGET,
    Mount,
    View,
    at_or_below,
    granted_mounts,
    mounts_named,
    views_of,
)
from cortexfs.policy.objects import NEEDED_ACCESS, TOOL_CONTROLS, Site, storage_site
from cortexfs.storage import (
    DOCS_BUNDLE,
    closed_on_the_way,
    not_reachable,
    not_readable,
    require_root,
)
from cortexfs.strict_modes import loose_entry


class Step(IntEnum):
    CREDENTIALS = 1
    MODE_BITS = 2
    VISIBILITY = 3
    LABEL = 4
    OBJECT_POLICY = 5
    OWN_POLICY = 6

    @property
    def title(self) -> str:
        return _TITLES[self]


_TITLES = {
    Step.CREDENTIALS: "peer credentials",
    Step.MODE_BITS: "mode bits",
    Step.VISIBILITY: "mount visibility",
    Step.LABEL: "agent label",
    Step.OBJECT_POLICY: "object policy",
    Step.OWN_POLICY: "tool/model policy",
}


class Outcome(StrEnum):
    PASS = "pass"
    DENY = "deny"
    NOT_APPLICABLE = "n/a"
    NOT_REACHED = "not reached"


class StepResult(NamedTuple):
    step: Step
    outcome: Outcome
    detail: str
    errno: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "step": int(self.step),
            "name": self.step.title,
            "result": str(self.outcome),
            "errno": errno.errorcode.get(self.errno) if self.errno else None,
            "detail": self.detail,
        }


class AuthorityRequest(NamedTuple):
    """May ``agent`` have ``permission`` on ``object_class:object_name`` in storage ``root``?

    ``caller`` holds the credentials the kernel reported for the asking process; None asks
    on the agent's own behalf (explanations, filtered listings), never for a request that
    arrived from a process.  ``location`` is the directory holding a tool (where CTX_PATH
    found it; default ``tool``) or a session (required); see :mod:`cortexfs.policy.objects`.
    """

    root: Path
    agent: str
    object_class: str
    object_name: str
    permission: str
    caller: Credentials | None = None
    location: str | None = None


class Decision(NamedTuple):
    """The answer: all six steps in order; the first denial, if any, decides."""

    steps: tuple[StepResult, ...]

    @property
    def denial(self) -> StepResult | None:
        return next((result for result in self.steps if result.outcome is Outcome.DENY), None)

    @property
    def allowed(self) -> bool:
        return self.denial is None

    @property
    def step(self) -> Step | None:
        """The denying step (its number and :attr:`Step.title`), None when allowed."""
        return None if self.denial is None else self.denial.step

    @property
    def errno(self) -> int:
        """EACCES, or ENOENT for a missing agent or object, or the host's shortage
        (:data:`~cortexfs.errors.HOST_SHORTAGES`) for a step it kept from judging; 0 when
        allowed."""
        return 0 if self.denial is None else self.denial.errno

    @property
    def reason(self) -> str:
        if self.denial is None:
            return "allowed: all six steps of the authority chain pass"
        return f"step {int(self.denial.step)} ({self.denial.step.title}): {self.denial.detail}"

    def raise_if_denied(self) -> None:
        if self.denial is not None:
            raise CtxError(self.errno, self.reason)

    def to_json(self) -> dict[str, object]:
        return {
            "allowed": self.allowed,
            "step": None if self.step is None else int(self.step),
            "step_name": None if self.step is None else self.step.title,
            "errno": errno.errorcode.get(self.errno) if self.errno else None,
            "reason": self.reason,
            "steps": [result.to_json() for result in self.steps],
        }


def check_authority(request: AuthorityRequest, facts: AgentFacts | None = None) -> Decision:
    """Run the six steps for ``request`` (P-5), with ``facts`` of its agent when the caller
    decides several requests together (read once, see :class:`AgentFacts`).

    Raises EINVAL for a malformed request (unknown class, a permission of another class, an
    illegal name or location), ENOENT when the storage root is missing, and EACCES when this
    process, not the agent, may not reach what decides the answer
    (:func:`refusal_of_this_process`); every other answer, including a missing agent or
    object, is a :class:`Decision`.
    """
    evaluation = _Evaluation(request, facts)
    results = [_run_step(Step.CREDENTIALS, _Evaluation.peer_credentials, evaluation)]
    if results[0].outcome is not Outcome.PASS:
        return Decision((results[0], *_not_reached_after(Step.CREDENTIALS)))
    # Steps 2 to 6 ask about the agent and the object, not about who asks: the answer one
    # request of these facts got is the answer for the next (the projection asks about the
    # tool the runner has just authorised).
    known = evaluation.facts.decided.get(evaluation.object_key)
    if known is None:
        for step, run in _STEPS[1:]:
            if results[-1].outcome in (Outcome.DENY, Outcome.NOT_REACHED):
                results.append(StepResult(step, Outcome.NOT_REACHED, _NOT_REACHED))
            else:
                results.append(_run_step(step, run, evaluation))
        known = evaluation.facts.decided[evaluation.object_key] = tuple(results[1:])
    return Decision((results[0], *known))


_NOT_REACHED = "an earlier step denied"


def _not_reached_after(step: Step) -> list[StepResult]:
    return [StepResult(later, Outcome.NOT_REACHED, _NOT_REACHED) for later in Step if later > step]


def caller_refusal(
    root: Path, agent: str, caller: Credentials, facts: AgentFacts | None = None
) -> Decision | None:
    """The chain's decision when its step 1 refuses ``caller`` as ``agent`` (the later steps
    not reached); None when ``caller`` is the agent.

    Step 1 depends on neither the object nor the permission, so whoever makes something for a
    request before the whole chain judges it asks this first: the tool runner, before it
    makes the session of the call in the agent's home (S-1), so that a caller who is not the
    agent leaves nothing behind.
    """
    if facts is None:
        facts = AgentFacts(root, agent)
    try:
        _judge_caller(facts, caller)
    except CtxError as exc:
        denial = StepResult(Step.CREDENTIALS, Outcome.DENY, exc.message, exc.errno)
        return Decision((denial, *_not_reached_after(Step.CREDENTIALS)))
    return None


def refusal_of_this_process(
    facts: AgentFacts, question: str, path: Path, exc: OSError
) -> CtxError | None:
    """The EACCES to raise instead of a verdict when ``exc``, met while reading ``path`` to
    judge whether agent ``facts.agent`` may ``question`` (``execute tool:fs.read``), is this
    process's own refusal and not the agent's; None when it is no refusal (not EACCES or
    EPERM) or one the agent meets too.

    The chain reads the storage root with this process's rights and judges the agent's
    from the mode bits.  Root reads everything (what refuses it, an attribute or a FUSE
    mount, refuses the agent's tools too), and a process of the agent's own uid is refused
    what the agent is: there a refusal denies, failing closed.  Any other uid (another user
    asking ``ctx policy explain`` about someone's agent) may be refused what the agent may
    read: a denial would be a false verdict on the agent, so the error names the directory
    that process may not enter, or else the file it may not read (a control only root may
    read), with its owner and mode, and says that the refusal is its own.
    """
    if exc.errno not in (errno.EACCES, errno.EPERM) or _reads_as_the_agent(facts):
        return None
    fix = (
        f"that refusal is uid {os.geteuid()}'s own and says nothing of agent {facts.agent!r}, "
        "so no verdict is given: ask as root, or as a user who may read what the chain reads "
        "(the agent's uid, say)"
    )
    action = f"judge whether agent {facts.agent!r} may {question}"
    refusal = not_reachable(path, action, fix)
    if refusal is not None:
        return refusal
    # A name read relative to a directory's descriptor says nothing of where it is.
    named = isinstance(exc.filename, str) and os.path.isabs(exc.filename)
    return not_readable(Path(exc.filename) if named else path, action, fix)


def _reads_as_the_agent(facts: AgentFacts) -> bool:
    """Whether the refusals this process meets are the agent's: it is root, or runs as the
    agent's uid (the runner of a storage owner, the agent's own explanation)."""
    if os.geteuid() == 0:
        return True
    try:
        return facts.declared_identity.uid == os.geteuid()
    except CtxError:
        return False  # an agent whose uid cannot be told: nobody asks as it


def _run_step(
    step: Step, run: Callable[[_Evaluation], _StepOutcome], evaluation: _Evaluation
) -> StepResult:
    try:
        outcome, detail = run(evaluation)
    except controls.UnreadableControl as exc:
        # Failing closed is a verdict only when the agent is refused that control too.
        _raise_refusal_of_this_process(evaluation, evaluation.root / exc.path, exc.refusal)
        return StepResult(step, Outcome.DENY, exc.message, exc.errno)
    except CtxError as exc:
        return StepResult(step, Outcome.DENY, exc.message, exc.errno)
    except OSError as exc:
        read = evaluation.read_by(step)
        _raise_refusal_of_this_process(evaluation, read, exc)
        if exc.errno in (errno.EACCES, errno.EPERM):  # the agent's refusal too: a verdict
            reason = _refused_to_the_agent(evaluation, step, read, exc)
            return StepResult(step, Outcome.DENY, reason, errno.EACCES)
        reason = f"cannot be checked, so it is denied: {exc.strerror or exc}"
        # Denied either way; the errno says whether for a verdict or for the host's state.
        code = exc.errno if exc.errno in HOST_SHORTAGES else errno.EACCES
        return StepResult(step, Outcome.DENY, reason, code)
    return StepResult(step, outcome, detail)


def _raise_refusal_of_this_process(evaluation: _Evaluation, path: Path, exc: OSError) -> None:
    """Raise :func:`refusal_of_this_process` for ``exc``, met reading ``path``, when it is one."""
    refusal = refusal_of_this_process(evaluation.facts, evaluation.question, path, exc)
    if refusal is not None:
        raise refusal from None


def _refused_to_the_agent(evaluation: _Evaluation, step: Step, path: Path, exc: OSError) -> str:
    """Why ``step`` denies when this process, whose refusals are the agent's
    (:func:`_reads_as_the_agent`), was refused ``exc`` on the way to ``path``, what the step
    reads (:meth:`_Evaluation.read_by`): the directory on the way it may not search, in the
    words step 2 uses when it can judge the bits (asked as root), else the file refused —
    never a bare "Permission denied" that leaves the administrator to guess what to open."""
    uid = evaluation.identity.uid  # step 1 passed: only then do later steps run
    directory = closed_on_the_way(path)
    if directory is not None:
        closed = f"search (x) on {evaluation.shown(directory)} is denied to uid {uid}"
        if step is Step.MODE_BITS:
            return closed
        return f"{evaluation.shown(path)} cannot be read: {closed}"
    # A name read relative to a directory's descriptor says nothing of where it is.
    named = isinstance(exc.filename, str) and os.path.isabs(exc.filename)
    refused = Path(exc.filename) if named else path
    return f"{evaluation.shown(refused)} cannot be read, so it is denied: {exc.strerror or exc}"


def check_tool_execute(
    root: Path,
    agent: str,
    tool: str,
    caller: Credentials | None,
    location: str | None = None,
    facts: AgentFacts | None = None,
) -> Decision:
    """May the process ``caller`` run ``tool`` as ``agent``?  The tool runner's question.

    Both layers of P-6 must allow ``tool:<tool> execute``: the agent's policy (step 5) and the
    tool's own ``<location>/<tool>.d/policy`` (step 6); the Linux steps come first.
    """
    request = AuthorityRequest(root, agent, "tool", tool, "execute", caller, location)
    return check_authority(request, facts)


_StepOutcome = tuple[Outcome, str]


class AgentFacts:
    """What the chain reads of one agent's controls, read at most once for every request
    decided with these facts: its identity (step 1), its mounts (step 3), its label with the
    judgement of its host-owned controls (step 4) and the policies read (steps 5 and 6).

    What was read and passed is kept, and so is the answer of steps 2 to 6 for each object
    (:attr:`decided`), which does not depend on who asks.  Facts are as current as their
    first reading: make new ones for each call or lookup (a policy change shows at the
    next).
    """

    def __init__(self, root: Path, agent: str) -> None:
        check_object_name(agent, "agent")
        self._given_root = Path(root)
        self.root = require_root(self._given_root).resolve()
        self.agent = agent
        self._policies: dict[PurePosixPath, Policy] = {}
        # Steps 2 to 6 of each object asked about, by (class, name, permission, location).
        self.decided: dict[tuple[str, str, str, str | None], tuple[StepResult, ...]] = {}

    @cached
    def _host_uid(self) -> int:
        return os.stat(self.root).st_uid

    def describes(self, request: AuthorityRequest) -> bool:
        if request.agent != self.agent:
            return False
        # The root as these facts were made for it needs no resolving (the runner, the view).
        asked = Path(request.root)
        return asked == self._given_root or asked.resolve() == self.root

    @cached
    def _agent_controls(self) -> controls.AgentControlFiles:
        """The agent's host-owned controls, read through one descriptor of its directory."""
        return controls.AgentControlFiles(self.root, self.agent)

    @cached
    def declared_identity(self) -> Identity:
        """The identity the agent's control names, before step 1 has judged it: ENOENT for a
        missing agent, EACCES for an unusable control."""
        controls.require_agent(self.root, self.agent)
        return controls.read_identity(self.root, self.agent, self._agent_controls)

    @cached
    def identity(self) -> Identity:
        """The agent's identity: ENOENT for a missing agent, EACCES for one that is root."""
        identity = self.declared_identity
        if identity.uid == 0:
            raise denied(
                f"agent {self.agent!r} has uid 0; an agent never runs as root, which would "
                "void the mode bits of step 2"
            )
        return identity

    @cached
    def mounts(self) -> tuple[Mount, ...]:
        return controls.read_mounts(self.root, self.agent, self._agent_controls)

    @cached
    def visible_mounts(self) -> tuple[Mount, ...]:
        """The mounts the agent's policy lets it see: what its tools get, less the storage
        root's projection (:func:`~cortexfs.policy.mounts.granted_mounts`)."""
        policy = self.policy(controls.control_path(self.agent, "policy"))
        label = self.declared_label
        return tuple(
            granted_mounts(
                self.mounts, lambda name, perm: Rule(label, "mount", name, perm) in policy
            )
        )

    @cached
    def declared_label(self) -> str:
        """The label the agent's control names, before step 4 has judged its controls."""
        return controls.read_label(self.root, self.agent, self._agent_controls)

    @cached
    def label(self) -> str:
        """The agent's label, once none of its host-owned controls is within its reach."""
        label = self.declared_label
        self.require_host_owned_controls()
        return label

    def require_host_owned_controls(self) -> None:
        """Step 4's judgement of the controls themselves (:meth:`require_strict_modes`,
        :meth:`require_host_owned`), which needs no label: whoever lists what is wrong with
        an agent says it of a policy within another's reach whatever its label says."""
        directory = controls.control_dir(self.agent)
        for path, entries in walk_to_each(self.root, directory, controls.HOST_OWNED_CONTROLS):
            self.require_strict_modes(path, entries=entries)
            self.require_host_owned(path, entries)

    def granting_policy(self) -> Policy:
        """The agent's own policy, once step 4 has judged its controls (:attr:`label`): a
        policy within another's reach than the host's grants nothing (its refusal raised)."""
        self.label  # noqa: B018 (the judgement, cached, raises)
        return self.policy(controls.control_path(self.agent, "policy"))

    def writes_through(self, view: View) -> bool:
        """Whether the agent may change what it sees at ``view``: through a read-write mount,
        or through its mount of the storage root, which its tools get as the agent's view of
        the root (T-5): writable below its own home and below each space its policy lets it
        read and write (``shared:<s> read`` and ``write``: the view shows no other), but for
        the space's ``tool/``, and nowhere else, whatever the mount's own mode.

        Below a writable space that view is stricter still (other agents' sessions, S-6); the
        steps after this one ask the policy about those.  Where this answer is wider than the
        view, step 4 and step 6 only refuse more: a control the agent might change is no
        grant.
        """
        return not self.read_only_reason(view)

    def shows(self, view: View) -> bool:
        """Whether the agent's tools see what lies at ``view`` (:meth:`hidden_reason`)."""
        return not self.hidden_reason(view)

    def hidden_reason(self, view: View) -> str:
        """Why the agent's view of the storage root does not show what lies at ``view``, in
        words an administrator can act on; "" when it does, or when ``view`` is through another
        mount (its table decides).  Below a space, the view shows the space only when the
        agent's policy allows ``shared:<s> read`` (X-1; the manual bundle is every agent's),
        and of the homes only the agent's own (:class:`cortexfs.agents.projection.ViewRules`
        shows the same).  A space itself is the object of its grant, asked at step 5."""
        parts = self._parts_in_root_view(view)
        if parts is None or len(parts) < 3 or parts[0] not in ("home", "shared"):
            return ""
        top, name = parts[:2]
        if top == "home":
            if name == str(self.identity.uid):
                return ""
            own = f"home/{self.identity.uid}"
            return f"of the homes, its view of the storage root shows only its own ({own})"
        if name == DOCS_BUNDLE:
            return ""
        try:
            label = self.declared_label
            policy = self.policy(controls.control_path(self.agent, "policy"))
        except CtxError:
            return ""  # controls that cannot be read or parsed are steps 4 and 5's to name
        if Rule(label, "shared", name, "read") in policy:
            return ""
        return (
            f"its view of the storage root shows a space only when its policy allows "
            f"'shared:{name} read' (X-1)"
        )

    def _parts_in_root_view(self, view: View) -> tuple[str, ...] | None:
        """Where ``view`` lies below the storage root, when it is through the agent's mount
        of the root (which its tools get as the agent's view of it); None through any other
        mount, whose table alone decides."""
        if PurePosixPath(view.mount.source) != PurePosixPath(self.root):
            return None
        return view.path.relative_to(view.mount.target).parts

    def read_only_reason(self, view: View) -> str:
        """Why :meth:`writes_through` says no for ``view``, in words an administrator can act
        on; "" when it says yes.  One decision for both, so that the answer and its reason
        cannot drift apart."""
        parts = self._parts_in_root_view(view)
        if parts is None:
            return "" if view.mount.writable else f"its mount {view.mount} is read-only"
        if len(parts) < 2 or parts[0] not in ("home", "shared"):
            return "in its view of the storage root only its home and spaces are ever writable"
        top, name = parts[:2]
        if top == "home":
            if name == str(self.identity.uid):
                return ""
            return f"of the homes, only its own (home/{self.identity.uid}) is writable in its view"
        if name == DOCS_BUNDLE:
            return "the manual bundle is read-only (D-1)"
        if parts[2:3] == ("tool",):
            return f"shared/{name}/tool/ is the host's: other agents run its tools"
        policy = self.policy(controls.control_path(self.agent, "policy"))
        label = self.declared_label
        if all(Rule(label, "shared", name, perm) in policy for perm in ("read", "write")):
            return ""
        return (
            f"a space is writable in its view only when its policy allows both "
            f"'shared:{name} read' and 'shared:{name} write'"
        )

    def forget_object(self, object_class: str, name: str) -> None:
        """Judge ``object_class:name`` afresh at its next request: its steps' answers and the
        policies read for it (all but the agent's own) were of files a reinstall of it has
        replaced since."""
        for key in [key for key in self.decided if key[:2] == (object_class, name)]:
            del self.decided[key]
        own = controls.control_path(self.agent, "policy")
        self._policies = {path: read for path, read in self._policies.items() if path == own}

    def policy(self, path: PurePosixPath) -> Policy:
        if path not in self._policies:
            self._policies[path] = controls.read_policy(self.root, path, self._agent_controls)
        return self._policies[path]

    def require_strict_modes(
        self,
        path: PurePosixPath,
        *,
        runs_as_agent: bool = False,
        entries: list[Entry] | None = None,
    ) -> None:
        """Deny unless ``path`` and every directory above it belong to the host: to root or
        the host administrator (the storage root's owner), not to the agent's uid (unless the
        agent runs as the host administrator) nor to any other, and not writable by a group or
        by others.

        As ssh's StrictModes does, whoever could get the write access: the mode bits of the
        agent's own uid, a group it may join later, a process running outside its mounts
        (``shell.exec`` is not confined to them) — a grant is only as safe as its file.  The
        same holds for code the agent runs, a tool's executable among it, except that the
        agent's own uid may own code that ``runs_as_agent`` only (a post-hook: running its own
        code as itself after a call gives it nothing new), but code another uid may change
        would run with the agent's grants.

        A directory writable by a group or by others is enough when it has the sticky bit and
        belongs to the host, and the entry below it does too: then nobody else may rename or
        remove that entry (a shared space's root, ``chmod +t``).

        ``entries``: the :func:`~cortexfs.beneath.walk` to ``path``, when the caller has
        made it already (one walk judges several files).
        """
        if entries is None:
            entries = walk(self.root, path)
        self._judge_strict_modes(path, entries, _host_of(entries), runs_as_agent=runs_as_agent)

    def require_strict_modes_in(
        self, directory: PurePosixPath, names: Sequence[str]
    ) -> dict[str, list[Entry]]:
        """:meth:`require_strict_modes` of each of ``names`` in ``directory`` that exists, in
        that order, at the cost of one walk: a tool's policy and its other controls.  Returns
        the walk to each of ``names``, as :func:`~cortexfs.beneath.walk` makes it, for
        judging them further."""
        entries, children = walk_with_children(self.root, directory, names)
        host = _host_of(entries)
        present = [child for child in children if child.status is not None]
        if not present:  # nothing there: whoever reads a file of it refuses it
            self._judge_strict_modes(directory, entries, host)
        else:
            # What lies above the directory is the same for each file: judged whole once, then
            # only the directory (whose sticky bit counts according to the file) and each file.
            self._judge_strict_modes(present[0].shown, [*entries, present[0]], host)
            for child in present[1:]:
                self._judge_strict_modes(child.shown, [entries[-1], child], host)
        if not children:  # the walk ended at or above the directory, as the walk to each would
            return {name: entries for name in names}
        return {name: [*entries, child] for name, child in zip(names, children, strict=True)}

    def _judge_strict_modes(
        self,
        path: PurePosixPath | str,
        entries: list[Entry],
        host: int,
        *,
        runs_as_agent: bool = False,
    ) -> None:
        """Deny, as :meth:`require_strict_modes` says, unless each of ``entries`` (of the walk
        to ``path``) belongs to ``host`` or root and is writable by its owner alone."""
        hosts = {0, host}
        owners = hosts | {self.identity.uid} if runs_as_agent else hosts
        loose = loose_entry([entry.status for entry in entries], owners, hosts)
        if loose is None:
            return
        entry = entries[loose]
        assert entry.status is not None
        owner, mode = entry.status.st_uid, stat.S_IMODE(entry.status.st_mode)
        if owner not in owners and owner == self.identity.uid:
            raise denied(
                f"{path} is not host-owned: {entry.shown} belongs to uid "
                f"{self.identity.uid}, the agent's own, so the agent could rewrite it "
                f"(give it to the host administrator, uid {host})"
            )
        if owner not in owners:
            raise denied(
                f"{path} is not host-owned: {entry.shown} belongs to uid {owner}, who "
                f"could rewrite it for agent {self.agent!r} (give it to the host "
                f"administrator, uid {host})"
            )
        space = _space_of_directory(entry.shown)
        remedy = (
            "chmod go-w"
            if space is None
            # An older version made a space's own directories 2770, without the sticky bit;
            # the product's repair gives them this version's modes, not go-w, which would
            # take the members' share away.
            else f"a space an older ctx made; run 'ctx shared create {space} --group "
            f"{entry.status.st_gid}', which gives its directories this version's modes"
        )
        raise denied(
            f"{path} is not host-owned: {entry.shown} is writable by its group or by "
            f"others (mode {mode:04o}); the agent's controls, the tools it runs and "
            f"their directories must be writable by their owner alone ({remedy})"
        )

    def require_host_owned(self, path: PurePosixPath, entries: list[Entry] | None = None) -> None:
        """A grant the agent could rewrite is no grant (P-6): deny if it can change ``path``.

        It can when it may write the file or a directory above it (mode bits) and sees that
        entry writably: through a read-write mount, or in its view of the storage root
        (:meth:`writes_through`).  For an agent that runs as the host administrator, the
        storage root's owner, only a read-write mount counts, as its own mount control says:
        its view of the root makes writable its own home, which, like everything the host
        owns, is its uid's anyway (:meth:`require_strict_modes` exempts it alike).
        ``entries`` as for :meth:`require_strict_modes`.
        """
        as_host = self.identity.uid == self._host_uid
        walked = walk(self.root, path) if entries is None else entries
        for entry in writable_on_walk(walked, self.identity):
            for view in views_of(self.mounts, PurePosixPath(self.root, entry)):
                if view.mount.writable if as_host else self.writes_through(view):
                    raise denied(
                        f"{path} is not host-owned: the agent may change {entry} "
                        f"(as uid {self.identity.uid}, at {view.path} through {view.mount})"
                    )


def _space_of_directory(shown: str) -> str | None:
    """The space whose own directory ``shown`` is (``shared/<space>`` or its ``tool/``, as a
    walk shows it), whose modes 'ctx shared create' sets; None for any other path."""
    parts = PurePosixPath(shown).parts
    if len(parts) not in (2, 3) or parts[0] != "shared" or parts[1] == DOCS_BUNDLE:
        return None
    return parts[1] if len(parts) == 2 or parts[2] == "tool" else None


def _host_of(entries: list[Entry]) -> int:
    """The host administrator's uid: the owner of the storage root a walk starts at."""
    return entries[0].status.st_uid if entries[0].status is not None else 0


class _Evaluation:
    """The facts of one request, gathered step by step so that each is read at most once."""

    def __init__(self, request: AuthorityRequest, facts: AgentFacts | None) -> None:
        check_object_name(request.agent, "agent")
        check_object(request.object_class, request.object_name, request.permission)
        if facts is None:
            facts = AgentFacts(request.root, request.agent)
        elif not facts.describes(request):
            raise ValueError(
                f"the facts of agent {facts.agent!r} in {facts.root} were "
                f"passed for a request of agent {request.agent!r}"
            )
        self.request = request
        self.facts = facts
        self.root = facts.root
        self.agent = request.agent
        self.object_class = request.object_class
        self.object_name = request.object_name
        self.permission = request.permission
        self.site: Site | None = storage_site(
            request.object_class, request.object_name, request.permission, request.location
        )
        self.access = NEEDED_ACCESS.get((request.object_class, request.permission), 0)
        self._label = ""
        self._site_walk: list[Entry] | None = None  # step 2's walk to the site, for step 6

    @property
    def object_ref(self) -> str:
        return f"{self.object_class}:{self.object_name}"

    @property
    def object_key(self) -> tuple[str, str, str, str | None]:
        request = self.request
        return (self.object_class, self.object_name, self.permission, request.location)

    @property
    def question(self) -> str:
        """What is asked, as an error says it: ``execute tool:fs.read``."""
        return f"{self.permission} {self.object_ref}"

    def shown(self, path: Path) -> str:
        """``path`` as the steps' reasons show it: relative to the storage root below it."""
        if path != self.root and path.is_relative_to(self.root):
            return str(path.relative_to(self.root))
        return str(path)

    def read_by(self, step: Step) -> Path:
        """What ``step`` reads for this request, to name it when this process may not: the
        object (a mount's source) at step 2, the object's own policy at step 6, else the
        agent's controls."""
        if step is Step.MODE_BITS and self.object_class == "mount":
            return Path(self._named_mount().source)  # found before its source was read
        if step is Step.MODE_BITS and self.site is not None:
            return self.root / self.site.path
        if step is Step.OWN_POLICY and self.site is not None and self.site.own_policy is not None:
            return self.root / self.site.own_policy
        return self.root / controls.control_dir(self.agent)

    def peer_credentials(self) -> _StepOutcome:
        return _judge_caller(self.facts, self.request.caller)

    def mode_bits(self) -> _StepOutcome:
        if self.object_class == "mount":
            source = Path(self._named_mount().source)
            verdict = check_access(source, PurePosixPath(), self.identity, self.access, Kind.ANY)
        elif self.site is not None:
            site = self.site
            self._site_walk = walk(self.root, site.path)
            verdict = check_access(
                self.root, site.path, self.identity, site.access, site.kind, self._site_walk
            )
        else:
            return Outcome.NOT_APPLICABLE, f"{self.object_ref} has no file on disk"
        if not verdict.allowed:
            raise CtxError(verdict.errno, verdict.detail)
        return Outcome.PASS, verdict.detail

    def visibility(self) -> _StepOutcome:
        if self.object_class == "mount":
            mount = self._named_mount()
            if self.access & WRITE and not mount.writable:
                raise denied(f"mount {mount.name!r} is read-only: {mount}")
            return Outcome.PASS, f"the agent has mount {mount}"
        if self.site is None:
            return Outcome.NOT_APPLICABLE, f"{self.object_ref} has no file on disk"
        host_path = PurePosixPath(self.root, self.site.path)
        views = views_of(self.mounts, host_path)
        if not views:
            withheld = self._withheld_showing(host_path, writes=False)
            raise denied(
                f"{self.site.path} is under none of the mounts of agent {self.agent!r}"
                + (f": {withheld}" if withheld else "")
            )
        shown = [view for view in views if self.facts.shows(view)]
        if not shown:
            withheld = self._withheld_showing(host_path, writes=False)
            raise denied(
                f"{self.site.path} is not in the view of agent {self.agent!r}: "
                f"{self.facts.hidden_reason(views[0])}" + (f"; {withheld}" if withheld else "")
            )
        views = shown
        if self.access & WRITE:
            writable = [view for view in views if self.facts.writes_through(view)]
            if not writable:
                why = self.facts.read_only_reason(views[0])
                withheld = self._withheld_showing(host_path, writes=True)
                raise denied(
                    f"{self.site.path} is visible to the agent only read-only: {why}"
                    + (f"; {withheld}" if withheld else "")
                )
            views = writable
        view = views[0]
        detail = f"{self.site.path} appears at {view.path} through {view.mount}"
        if self.access & WRITE and PurePosixPath(view.mount.source) == PurePosixPath(self.root):
            detail += ", writable in the agent's view of the storage root"
        return Outcome.PASS, detail

    def _withheld_showing(self, host_path: PurePosixPath, *, writes: bool) -> str:
        """Why the mounts of the agent's table that would show ``host_path`` (writably, when
        ``writes``) are withheld, each reason once, as ``ctx agent show`` says it (two mounts
        of one name share theirs); "" when none would.  Its mount at ``/ctx`` counts whatever
        its source: one that names another root (this one moved or copied since) is meant as
        this one.  Step 3 sees through none of them, and says so rather than leave the table or
        the policy to be blamed.  Read only for a denial, so the table is read again here."""
        problems = [
            problem
            for mount, problem in controls.withheld_mounts(self.root, self.agent)
            if mount.target == CTX_TARGET
            or (at_or_below(host_path, mount.source) and (mount.writable or not writes))
        ]
        return "; ".join(dict.fromkeys(problems))

    def label(self) -> _StepOutcome:
        self._label = self.facts.label
        return Outcome.PASS, f"{self._label} (the agent cannot rewrite its own controls)"

    def object_policy(self) -> _StepOutcome:
        bundle_read = ("shared", DOCS_BUNDLE, "read")
        if (self.object_class, self.object_name, self.permission) == bundle_read:
            # As every agent's view shows it and its tools read it: the manuals grant nothing
            # and are granted to no one in particular (X-2, D-1).
            return Outcome.PASS, f"{DOCS_BUNDLE} is the manual bundle, every agent's to read"
        outcome, detail = self._allowed_by(controls.control_path(self.agent, "policy"))
        if self.object_class != "mount" and self.site is not None:
            detail += f"; {self._granted_mount()}"
        return outcome, detail

    def _granted_mount(self) -> str:
        """Step 3 found the object under the agent's mount table; the policy must also grant
        a mount it is seen through (``mount:<name> read``, and ``write`` to write through
        one), as the view its tools get shows only such mounts (T-5): one answer to whether
        the agent sees it."""
        assert self.site is not None
        host_path = PurePosixPath(self.root, self.site.path)
        writes = bool(self.access & WRITE)
        views = [v for v in views_of(self.facts.visible_mounts, host_path) if self.facts.shows(v)]
        if writes:
            views = [view for view in views if self.facts.writes_through(view)]
        if views:
            return f"its mount {views[0].mount.name!r} is granted"
        # The mounts step 3 found it through (writably, to write): what each lacks.  Any one
        # of them granted is enough, so their wants are alternatives.
        found = [view for view in views_of(self.mounts, host_path) if self.facts.shows(view)]
        if writes:
            found = [view for view in found if self.facts.writes_through(view)]
        policy = self.facts.policy(controls.control_path(self.agent, "policy"))
        lacking = []
        for mount in dict.fromkeys(view.mount for view in found):
            needed = (
                ["read", "write"]
                if writes and PurePosixPath(mount.source) != PurePosixPath(self.root)
                else ["read"]
            )
            rules = [Rule(self._label, "mount", mount.name, perm) for perm in needed]
            lacking.append(" and ".join(f"'{rule}'" for rule in rules if rule not in policy))
        how = "writably " if writes else ""
        raise denied(
            f"{self.site.path} is seen {how}only through mount "
            f"{', '.join(sorted({view.mount.name for view in found}))}, which "
            f"{controls.control_path(self.agent, 'policy')} does not grant: it lacks "
            + ("; or ".join(want for want in lacking if want) or "a rule for it")
        )

    def own_policy(self) -> _StepOutcome:
        if self.site is None or self.site.own_policy is None:
            return Outcome.NOT_APPLICABLE, f"{self.object_class} objects have no own policy"
        # The second layer of P-6 is the host's: its file, and for a tool the executable it
        # grants and the controls that describe and set it up (its cap decides whether it
        # may reach the network, its mcp control which server it starts), are no more the
        # agent's or another uid's to rewrite than the agent's own controls (step 4).
        own_policy = self.site.own_policy
        if self.object_class == "tool":
            walks = self.facts.require_strict_modes_in(own_policy.parent, TOOL_CONTROLS)
            policy_walk = walks[own_policy.name]
        else:
            policy_walk = walk(self.root, own_policy)
            self.facts.require_strict_modes(own_policy, entries=policy_walk)
        self.facts.require_host_owned(own_policy, policy_walk)
        if self.object_class == "tool":
            # The executable as step 2 walked to it: one look judges its bits and its owner.
            self.facts.require_strict_modes(self.site.path, entries=self._site_walk)
            self._require_host_owned_hooks(own_policy.parent / "hooks")
        return self._allowed_by(own_policy)

    def _require_host_owned_hooks(self, hooks: PurePosixPath) -> None:
        """Hooks run under the agent's identity, and a pre-hook guards the tool's calls (T-6):
        each hook directory, and each hook in it, is held to StrictModes as the tool's policy
        is.  A post-hook only runs code as the agent, so the agent's own uid may own it, as it
        may own an executable it runs; a pre-hook it could rewrite would be no guard."""
        phases = (("pre.d", False), ("post.d", True))
        listings = walk_to_listings(self.root, hooks, [phase for phase, _ in phases])  # one walk
        for (phase, runs_as_agent), (entries, listed) in zip(phases, listings, strict=True):
            directory = hooks / phase
            if listed is None:
                continue  # missing or linked: the runner refuses the damaged tool
            self.facts.require_strict_modes(directory, entries=entries)
            for name in sorted(listed):
                status = listed[name].status
                if status is None or not stat.S_ISREG(status.st_mode):
                    continue  # not run as a hook (a link or special file vetoes the call)
                if status.st_mode & 0o111:
                    walked = [*entries, listed[name]]
                    self.facts.require_strict_modes(
                        directory / name, runs_as_agent=runs_as_agent, entries=walked
                    )

    @property
    def identity(self) -> Identity:
        return self.facts.identity  # step 1 read it, or denied and no later step runs

    @property
    def mounts(self) -> tuple[Mount, ...]:
        return self.facts.mounts

    def _named_mount(self) -> Mount:
        # No two usable mounts share a name: two that would are both withheld.
        matches = mounts_named(self.mounts, self.object_name)
        if not matches:
            withheld = [
                problem
                for mount, problem in controls.withheld_mounts(self.root, self.agent)
                if mount.name == self.object_name
            ]
            if withheld:  # in its table, but unusable: why, as 'ctx agent show' says it
                raise denied(f"its mount {self.object_name!r} is withheld: {withheld[0]}")
            raise not_found(f"agent {self.agent!r} has no mount named {self.object_name!r}")
        return matches[0]

    def _allowed_by(self, path: PurePosixPath) -> _StepOutcome:
        rule = Rule(self._label, self.object_class, self.object_name, self.permission)
        if rule not in self.facts.policy(path):
            raise denied(f"{path} has no rule '{rule}'")
        return Outcome.PASS, f"{path}: {rule}"


def _judge_caller(facts: AgentFacts, caller: Credentials | None) -> _StepOutcome:
    """Step 1: ``caller`` (None: the agent asking for itself) is agent ``facts.agent``."""
    identity = facts.identity
    if caller is None:
        return Outcome.PASS, f"asked as agent {facts.agent!r} itself ({identity.credentials})"
    if caller != identity.credentials:
        raise denied(f"the caller is {caller}, but agent {facts.agent!r} is {identity.credentials}")
    return Outcome.PASS, f"{caller} is agent {facts.agent!r}"


_STEPS: tuple[tuple[Step, Callable[[_Evaluation], _StepOutcome]], ...] = (
    (Step.CREDENTIALS, _Evaluation.peer_credentials),
    (Step.MODE_BITS, _Evaluation.mode_bits),
    (Step.VISIBILITY, _Evaluation.visibility),
    (Step.LABEL, _Evaluation.label),
    (Step.OBJECT_POLICY, _Evaluation.object_policy),
    (Step.OWN_POLICY, _Evaluation.own_policy),
)
