"""The run capability: what the host does, during one call, for the tool it runs (SPEC A-4, A-5).

Some core tools need the host to act for them: ``agent.update`` rewrites a control of the
calling agent, ``agent.create`` makes a child agent, and the agent's uid may write neither. For
such a call the runner hands the tool one end of a socket pair (:class:`Capability`), bound to
that call's agent; the tool sends one JSON request per line, the host answers each with one JSON
line. The binding is the receipt: the tool never names the agent, so an agent can change only
its own controls, and only while its own call runs.

A descriptor can be copied (``pidfd_getfd``, or inherited by whatever the tool starts), and
another process of the agent's uid — another agent's — could use the copy while the call runs.
So the capability is bound to more than the agent:

* to the call's tool: it answers the operation of the tool it was handed to and no other
  (``agent.update`` cannot create agents; both policies allowed that one tool, P-6);
* to the tool's process: the host end receives the sender's credentials with every write
  (``SO_PASSCRED``; the kernel fills them in, and a process without ``CAP_SYS_ADMIN`` cannot
  claim another pid), and the first write from any other process ends the capability
  unanswered.

``agent.update`` replaces exactly one of the caller's ``system.md`` or ``prompt.template.md``
with at most :data:`MAX_UPDATE_BYTES` of UTF-8 text, atomically; any other control is EINVAL.
It changes what the next run's prompt is rendered from, nothing else.  Both operations leave
a fact in the agent's ``log`` (:mod:`cortexfs.agents.log`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from cortexfs import durable, jsontext
from cortexfs.agents import log as agent_log
from cortexfs.errors import CtxError, denied, exists, invalid, too_big
from cortexfs.exit_watch import ExitWatch
from cortexfs.policy import AuthorityRequest, check_authority
from cortexfs.policy import controls as agent_controls
from cortexfs.shared.events import EventLog
from cortexfs.storage import DOCS_BUNDLE
from cortexfs.tools.controls import ToolObject, read_controls, require_available
from cortexfs.tools.core.hostcall import (
    ENVIRONMENT,
    MAX_REQUEST_LINE,
    MAX_UPDATE_BYTES,
    update_too_big,
)
from cortexfs.tools.ctxpath import tier_location

if TYPE_CHECKING:
    from cortexfs.agents.view import AgentView

UPDATABLE = ("system.md", "prompt.template.md")
# C0 but tab, line feed and carriage return; DEL; C1.
_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_START_SECONDS = 30.0  # how long a write may wait for the runner to say which process it started


class Capability:
    """One call's capability: the tool's end to pass on, the host's end served meanwhile.

    ``operation`` is the one it answers (the call's tool); :meth:`bind` names the tool's
    process once it is started, and only that process is answered."""

    def __init__(self, root: Path, agent: str, operation: str, session: str = "") -> None:
        self.root, self.agent, self.operation, self.session = root, agent, operation, session
        self._host, self._tool = socket.socketpair()
        # Before the tool can write: credentials come with the writes made after this.
        self._host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._tool_pid: int | None = None
        self._tool_exit: ExitWatch | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="capability", daemon=True)

    def bind(self, pid: int) -> None:
        """The tool's process, as started: the only writer answered, and only while it runs
        (a pid is free for another process once the tool has exited and been reaped).  The
        tool has its copy of the capability now; ours is closed, one copy fewer to take."""
        self._tool_pid = pid
        self._tool_exit = ExitWatch(pid)
        self._started.set()
        self._tool.close()

    @property
    def tool_descriptor(self) -> int:
        return self._tool.fileno()

    def environment(self) -> dict[str, str]:
        """What the tool's environment says about its capability."""
        return {ENVIRONMENT: str(self.tool_descriptor)}

    @contextlib.contextmanager
    def serving(self) -> Iterator[Capability]:
        """Served while the block runs (the tool's process); closed at its end."""
        self._thread.start()
        try:
            yield self
        finally:
            self._tool.close()  # the tool's copy is its own now; ours is not needed
            with contextlib.suppress(OSError):
                self._host.shutdown(socket.SHUT_RDWR)
            self._thread.join(timeout=5)
            self._host.close()
            if self._tool_exit is not None:
                self._tool_exit.close()

    def _serve(self) -> None:
        """Answer each line the tool's process writes; end at the first write of another
        process, or at a line longer than any request (the tool is cut off: its call fails
        with no answer, and nothing is done for the writer)."""
        pending = b""
        space = socket.CMSG_SPACE(_CREDENTIALS.size)
        with contextlib.suppress(OSError):
            try:
                while True:
                    data, ancillary, _, _ = self._host.recvmsg(MAX_REQUEST_LINE + 1, space)
                    if not data or not self._from_the_tool(ancillary):
                        return
                    pending += data
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        self._host.sendall(json.dumps(self.answer(line)).encode() + b"\n")
                    if len(pending) > MAX_REQUEST_LINE:
                        return
            finally:
                self._host.shutdown(socket.SHUT_RDWR)  # every copy's reader sees the end

    def _from_the_tool(self, ancillary: list[tuple[int, int, bytes]]) -> bool:
        """Whether the kernel says these bytes were written by the tool's process.  (A Unix
        stream never joins the writes of two senders in one read.)"""
        senders = [
            _CREDENTIALS.unpack(data[: _CREDENTIALS.size])[0]
            for level, kind, data in ancillary
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
        ]
        if not self._started.wait(_START_SECONDS):
            return False  # the runner never started a tool: nobody is answered
        return senders == [self._tool_pid] and self._tool_runs()

    def _tool_runs(self) -> bool:
        """Whether the bound process has not exited: then its pid is still its own, and the
        writer the kernel named by it was the tool."""
        assert self._tool_exit is not None
        return not self._tool_exit.exited()

    def answer(self, line: bytes) -> dict[str, Any]:
        try:
            # Strict: nesting past MAX_DEPTH is a ValueError here, where json.loads would
            # recurse until the thread answering the tool died of it.
            request = jsontext.loads_strict(line, unique_names=False)
            asked = request.get("op") if isinstance(request, dict) else None
            if asked not in OPERATIONS:
                raise invalid(f"the capability answers {' and '.join(OPERATIONS)} only")
            if asked != self.operation:
                raise denied(
                    f"this call's capability answers {self.operation} only, the tool it was "
                    "given to"
                )
            return {"ok": True, **OPERATIONS[self.operation](self, request)}
        except CtxError as error:
            return error.to_json()
        except ValueError as exc:
            return invalid(f"the request is not JSON: {exc}").to_json()
        except OSError as exc:
            # A refusal of the kernel an operation did not put in its own words is answered
            # all the same: unanswered, the tool could say only that the host gave no answer,
            # which is what a capability used by another process gets.
            return CtxError(exc.errno or errno.EIO, _in_words(exc)).to_json()


def _in_words(exc: CtxError | OSError) -> str:
    """What ``exc`` says, without its errno's word (the answer carries that on its own)."""
    if isinstance(exc, CtxError):
        return exc.message
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)


def update_control(call: Capability, request: dict[str, Any]) -> dict[str, Any]:
    """A-5: replace the calling agent's ``system.md`` or ``prompt.template.md``, atomically;
    the fact (never the content, S-4) goes to its log."""
    control, content = request.get("control"), request.get("content")
    if control not in UPDATABLE:
        raise invalid(
            f"agent.update changes only {' or '.join(UPDATABLE)}, not {control!r}: every other "
            "control belongs to the host"
        )
    if not isinstance(content, str):
        raise invalid("'content' must be a string")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate JSON's \ud800 can carry
        raise invalid(
            f"'content' holds {content[exc.start]!r} at character {exc.start}, a lone "
            "surrogate no UTF-8 text can hold"
        ) from None
    if len(data) > MAX_UPDATE_BYTES:
        raise too_big(update_too_big(control, len(data)))
    control_character = _CONTROL_CHARACTER.search(content)
    if control_character:
        # The prompts are text a person reads in a terminal too: an escape sequence in them
        # could rewrite what that person sees.
        raise invalid(
            f"'content' holds the control character {control_character.group()!r} at "
            f"character {control_character.start()}; {control} is text: tabs and line ends "
            "are its only control characters"
        )
    _replace_recorded(call, control, data)
    return {"agent": call.agent, "control": control, "bytes": len(data)}


def _replace_recorded(call: Capability, control: str, data: bytes) -> None:
    """Replace the calling agent's ``control`` by ``data`` and record it in the agent's log.

    The rename is the update: the new file is written beside the control and the log opened
    before it, so that an update the log cannot record (a directory or an immutable file at
    its name) is refused while nothing has changed, as one the directory cannot take (full,
    read-only) is — never reported failed after the next run's prompt has changed (A-5,
    S-3).  Every refusal names what refused, with its errno."""
    root, agent = call.root, call.agent
    ops = durable.default_ops()
    directory = durable.open_dir_path(ops, str(root / "agent" / f"{agent}.d"))
    staged = durable.temporary_name(control)
    try:
        try:
            durable.write_file_synced(ops, directory, staged, data, 0o644, exact_mode=True)
            with _log_to_record(control, root, agent) as log:
                durable.replace_synced(ops, directory, staged, directory, control)
                _record_update(log, call, control, len(data))
        except OSError as exc:
            reason = f"cannot replace {control}: {exc.strerror}"
            raise CtxError(exc.errno or errno.EIO, reason) from None
        finally:
            # Left only by a refusal (the log's, the rename's): once it has replaced the
            # control, or when it was never made, there is nothing to remove.
            with contextlib.suppress(OSError):
                ops.unlink(staged, directory)
    finally:
        ops.close(directory)


def _log_to_record(control: str, root: Path, agent: str) -> EventLog:
    """The agent's log, open to record the update of ``control``; its refusal, saying that
    ``control`` was left unchanged."""
    try:
        return agent_log.open_log(root, agent)
    except CtxError as exc:
        raise CtxError(
            exc.errno,
            f"{control} was left unchanged, for its update could not be recorded: {exc.message}",
        ) from None


def _record_update(log: EventLog, call: Capability, control: str, size: int) -> None:
    """Append ``agent.updated`` once ``control`` is replaced; its refusal (the disk filled up
    since the log was opened, say) says that the control was replaced all the same."""
    fact = agent_log.make_fact(
        call.agent, agent_log.UPDATED, session=call.session, control=control, bytes=size
    )
    try:
        log.append(fact, durable_event=True)
    except (CtxError, OSError) as exc:
        raise CtxError(
            exc.errno or errno.EIO,
            f"{control} was replaced, but agent {call.agent}'s log could not record it: "
            f"{_in_words(exc)}",
        ) from None


def create_child(call: Capability, request: dict[str, Any]) -> dict[str, Any]:
    """A-4: ``parent`` creates the agent its request describes, attenuated.

    The parent must hold ``agent:<child> create``.  Every grant of the child must be one the
    parent may use itself through the whole authority chain (P-5, both layers of P-6), for its
    own label: a tool on the parent's ``CTX_PATH`` that its policy *and* the tool's own policy
    let it execute, a model both policies let it use, a shared space it may read or write —
    being named in the parent's policy is not enough.  The child's label is its own or its
    parent's, never another agent's: tool and model policies grant by label, so taking another
    agent's label would take that agent's grants.  A mount's source is a path as the parent's
    tools see it (``/workspace/sub``, ``/ctx/shared/<s>/data``) when one of its mounts shows
    that path, else a host path (:meth:`_Reach.in_host_terms`).  Every mount must lie within
    what the parent's tools reach, read-write only where they may write (:class:`_Reach`):
    inside its view of ``/ctx``, only what its projection shows (T-5); the child runs as the
    parent's uid, gid and groups.  Nothing is inherited that the request does not name.
    """
    from cortexfs.agents.create import create_agent, label_owners
    from cortexfs.agents.request import parse_request
    from cortexfs.agents.view import AgentView

    root, parent = call.root, call.agent

    view = AgentView.load(root, parent)
    reach = _Reach(view)
    document = reach.in_host_terms(request.get("request"))
    child = parse_request(document, f"agent.create by {parent}", root)
    if not view.allows("agent", child.name, "create"):
        raise denied(f"agent {parent} holds no agent:{child.name} create (A-4)")
    if agent_controls.agent_exists(root, child.name):
        # Before the label check, which would otherwise name the existing child as the
        # label's owner.
        raise exists(f"agent/{child.name} already exists; an agent is never overwritten")

    def require_label_of_its_own() -> None:
        owner = next((agent for agent in label_owners(root, child.label) if agent != parent), None)
        if owner is not None and child.label != view.label:
            raise denied(
                f"label {child.label} is agent {owner}'s: a child takes a label of its own or "
                "its parent's, since tool and model policies grant by label (A-4)"
            )

    require_label_of_its_own()
    missing = [
        f"tool:{tool} execute ({reason})"
        for tool in child.tools
        if (reason := _parent_may_not_execute(view, tool))
    ]
    missing += [
        f"model:{model} use ({reason})"
        for model in child.models
        if (reason := _parent_denied(view, "model", model, "use"))
    ]
    missing += [
        f"shared:{space} {permission} ({reason})"
        for space, permissions in child.shared
        for permission in permissions
        if (reason := _parent_denied(view, "shared", space, permission))
    ]
    judged = [(reach.real(source), target, mode) for source, target, mode in child.mounts]
    # Named by its target, as the request gave it: the real path was resolved as root, and a
    # link's target in a directory the parent may not read is not the parent's to learn.
    missing += [
        f"the mount at {target} ({mode})"
        for real, target, mode in judged
        if not reach.holds(real, writable=mode == "rw")
    ]
    if missing:
        raise denied(f"agent.create attenuates (A-4): {parent} does not hold {'; '.join(missing)}")
    # Only now, when every space the child is granted is one the parent may use (S-6): a
    # space it may not read is EACCES above, whatever it holds, never an EEXIST that tells
    # the parent what lies in a directory its uid may not even search.
    _require_no_earlier_sessions(root, child.name, view.identity.uid, child.shared)
    # The child's mounts are the real paths judged here: a link on the way, repointed later,
    # would otherwise lead them somewhere else.
    child = dataclasses.replace(
        child, mounts=tuple((str(real), target, mode) for real, target, mode in judged)
    )
    # Asked again under agent/'s install lock: another child made meanwhile may have taken it.
    created = create_agent(
        root,
        child,
        view.identity,
        parent=parent,
        session=call.session,
        refuse_under_lock=require_label_of_its_own,
    )
    return {
        "agent": created.name,
        "label": child.label,
        "uid": created.identity.uid,
        "warnings": list(created.warnings),
    }


def _require_no_earlier_sessions(
    root: Path, name: str, uid: int, shared: tuple[tuple[str, Any], ...]
) -> None:
    """EEXIST when an earlier agent of the child's name left its sessions where the child's
    would go (its home, a space it is granted): the child would read them as its own, and a
    child inherits nothing (A-4).  Removing an agent by hand leaves them."""
    places = [f"home/{uid}/agent/{name}", *(f"shared/{space}/agent/{name}" for space, _ in shared)]
    for place in places:
        if os.path.lexists(root / place):
            raise exists(
                f"{place} holds the sessions of an earlier agent named {name}, which a child "
                "of that name would read as its own: a child inherits nothing (A-4); have the "
                "host administrator move them aside, or create the child under another name"
            )


def _parent_may_not_execute(view: AgentView, tool: str) -> str:
    """Why the parent may not run ``tool`` as it would find it on its ``CTX_PATH``; "" if it may."""
    # Any execute bit makes a hit (T-4); whether they are the parent's is the chain's step 2.
    found = view.find_tool(tool)
    if found is None:
        return f"no such tool on its CTX_PATH {view.ctx_path()}"
    tool_object = ToolObject(tool, found.directory)
    try:
        require_available(tool_object, read_controls(tool_object))
    except CtxError as exc:
        return exc.message  # a disabled, unavailable or damaged tool runs for nobody
    location = tier_location(view.root, found.directory) or "tool"
    return _parent_denied(view, "tool", tool, "execute", location)


def _parent_denied(
    view: AgentView, object_class: str, name: str, permission: str, location: str | None = None
) -> str:
    """The authority chain's refusal of the parent's own use of an object; "" when allowed."""
    request = AuthorityRequest(view.root, view.name, object_class, name, permission, None, location)
    decision = check_authority(request)
    return "" if decision.allowed else decision.reason


class _Reach:
    """What the parent's tools reach: the places its ``CTX_MOUNTS`` show
    (:meth:`AgentView.tool_mounts`), by the rules the tools resolve a path with
    (:mod:`cortexfs.tools.core.confine`), on real paths.

    A child's mount must lie within that reach, read-write only where the parent may write.
    Being below the source of one of the parent's mounts is not enough: its mount of the
    storage root shows only its projection (T-5), so ``shared/<s>`` of a space it may not
    read is out of its reach though the root holds it.  A place is reached through the mount
    that shows it (the deepest target, the later one on a tie); at the target of a filtered
    mount only the names it lists are reached, and not the filtered directory itself, whose
    other names a mount of it would show; and nothing below the place may be covered by
    another mount, which would hide what a mount of the place shows.

    The storage root itself is the exception: a child's mount of it is its own projection at
    call time, decided by the child's policy, which is within the parent's; it needs only that
    the parent has one.
    """

    def __init__(self, view: AgentView) -> None:
        self.parent = view.name
        self.root = self.real(view.root)
        self.root_mounts = [
            mount for mount in view.visible_mounts() if self.real(mount.source) == self.root
        ]
        self.mounts = view.tool_mounts()
        self.sources = [self.real(mount.source) for mount in self.mounts]

    @staticmethod
    def real(path: str | os.PathLike[str]) -> PurePosixPath:
        return PurePosixPath(os.path.realpath(path))

    def in_host_terms(self, document: object) -> object:
        """``document`` (an agent request) with each mount source the parent's view shows
        replaced by the host path behind it, through the mount that shows it: an agent knows
        its mounts by their targets (A-4: the child's mounts are within the parent's *visible*
        mounts), the host by their sources.  Any other source is taken as a host path, and
        either way :meth:`holds` then judges the real path.  Anything malformed is left as
        it is, for the request's validation to name."""
        if not isinstance(document, dict) or not isinstance(document.get("mount"), list):
            return document
        mounts = []
        for entry in document["mount"]:
            if isinstance(entry, list) and entry and isinstance(entry[0], str):
                entry = [self._host_path(entry[0]), *entry[1:]]
            mounts.append(entry)
        return {**document, "mount": mounts}

    def _host_path(self, source: str) -> str:
        if "." in source.split("/"):
            return source  # PurePosixPath would drop it: left for the request's validation
        place = PurePosixPath(source)
        chosen = self._topmost(place) if place.is_absolute() else None
        if chosen is None:
            return source
        mount = self.mounts[chosen]
        return str(PurePosixPath(mount.source) / place.relative_to(mount.target))

    def holds(self, real: PurePosixPath, *, writable: bool) -> bool:
        """Whether the parent's tools reach the host directory ``real`` (a real path), and
        may write there when ``writable``."""
        if real == self.root:
            return any(mount.writable or not writable for mount in self.root_mounts)
        if self._holds_sessions_of_others(real):
            return False
        return any(
            self._shows(index, real, writable)
            for index, source in enumerate(self.sources)
            if real == source or source in real.parents
        )

    def _holds_sessions_of_others(self, real: PurePosixPath) -> bool:
        """Whether ``real`` is ``shared/`` or ``home/``, a space or a home, its ``agent/``,
        or another agent's directory or anything in it (its ``session/``, a session not made
        yet): the sessions other agents record there later — another agent of the same uid,
        in a home — would show through a mount of it unfiltered, whoever may read them (S-6),
        and for as long as the child exists.  The parent's projection filters them at each
        call; a mount is made once."""
        if self.root not in real.parents:
            return False
        parts = real.relative_to(self.root).parts
        if parts[0] not in ("shared", "home") or parts[1:2] == (DOCS_BUNDLE,):
            return False  # the manual bundle holds no sessions
        if len(parts) <= 2:
            return True  # every space or home, or this one, holds agent/
        if parts[2] != "agent":
            return False
        return len(parts) == 3 or parts[3] != self.parent

    def _shows(self, index: int, real: PurePosixPath, writable: bool) -> bool:
        mount = self.mounts[index]
        place = mount.target / real.relative_to(self.sources[index])
        if self._topmost(place) != index or (writable and not mount.writable):
            return False
        if mount.names is not None:
            below = place.relative_to(mount.target).parts
            if not below or below[0] not in mount.names:
                return False
        return not any(
            self._hides(other, place, real, writable) for other in range(len(self.mounts))
        )

    def _hides(self, index: int, place: PurePosixPath, real: PurePosixPath, writable: bool) -> bool:
        """Whether mount ``index`` covers part of what a mount of ``real`` at ``place`` shows:
        its target lies below ``place`` and it shows anything but the same directory, whole,
        as writable as the child's mount would be."""
        mount = self.mounts[index]
        if place not in mount.target.parents:
            return False
        same = self.sources[index] == real / mount.target.relative_to(place)
        return not same or mount.names is not None or (writable and not mount.writable)

    def _topmost(self, place: PurePosixPath) -> int | None:
        chosen = None
        for index, mount in enumerate(self.mounts):
            if place != mount.target and mount.target not in place.parents:
                continue
            if chosen is None or len(mount.target.parts) >= len(self.mounts[chosen].target.parts):
                chosen = index
        return chosen


OPERATIONS = {"agent.update": update_control, "agent.create": create_child}
