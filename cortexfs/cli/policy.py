"""``ctx policy``: check policy files, query them, explain a decision (SPEC P-8, P-5, P-6)."""

from __future__ import annotations

import errno
import functools
import os
import sys
from pathlib import Path, PurePosixPath
from typing import NoReturn

import click

from cortexfs.agents.view import AgentView
from cortexfs.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    echo_printable,
    emit_json,
    emit_json_error,
    for_this_storage,
    handles_errors,
    json_option,
    require_standard_input,
    resolve_storage,
    storage_option,
    usage_problem,
)
from cortexfs.cli.params import MAX_ID, NonEmptyPath
from cortexfs.errors import CtxError, invalid
from cortexfs.names import decimal_value, is_decimal, shown_number
from cortexfs.policy import (
    AuthorityRequest,
    Credentials,
    Decision,
    Policy,
    PolicySyntaxError,
    all_allow,
    check_authority,
    make_rule,
    refusal_of_this_process,
)
from cortexfs.policy.controls import UnreadableControl
from cortexfs.policy.grammar import check_object, split_object_ref
from cortexfs.policy.objects import check_location
from cortexfs.regular_file import MAX_POLICY_BYTES, read_regular_file, read_up_to
from cortexfs.tools.controls import ToolObject, read_controls, require_available
from cortexfs.tools.ctxpath import tier_location

STDIN = "-"


@click.group()
def policy() -> None:
    """Policy v0: check policy files, answer queries, explain decisions.

    \b
    A policy holds one rule per line; blank lines and # comment lines are ignored:
        allow SUBJECT_t CLASS:NAME PERMISSION
        allow coder_t tool:fs.read execute
        allow coder_t model:openai/gpt-5.6 use
    Anything not allowed is denied.  Classes and their permissions:
        tool: execute        model: use          shared: read write
        session: read write resume               mount: read write
        agent: create start stop read write
        network: connect (object 'default')
    See docs/policy.md for the grammar and the six-step authority chain.
    """


# A policy FILE, or - for standard input; an empty one names no file (a usage error).  What
# the file is, and whether it can be read, is for the command to say (EACCES, exit 1).
_POLICY_FILE = NonEmptyPath(allow_dash=True, path_type=str)


@policy.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...", type=_POLICY_FILE)
@json_option
def check(files: tuple[str, ...], as_json: bool) -> None:
    """Validate policy FILEs ('-' reads standard input).

    Exit 0 when every file is valid.  Otherwise exit 1 and print on standard error one line
    for every invalid line of every file (a file with any invalid line is invalid as a whole):

    \b
        FILE:LINE: EINVAL: <reason>

    A file larger than 16 MiB (16777216 bytes) is invalid as a whole: one line
    'FILE: EINVAL: …', as for a file that cannot be read.
    --json also prints {"valid", "files": [{"file", "valid", "problems": [{"line", "error",
    "errno", "message"}]}]} on stdout; a file that cannot be read has one problem, line null.
    """
    reports = []
    for name in files:
        problems: list[dict[str, object]] = []
        try:
            Policy.from_bytes(_read_input(name), source=name)
        except PolicySyntaxError as exc:
            for problem in exc.problems:
                echo_printable(str(problem), err=True)
                problems.append({"line": problem.line, **invalid(problem.reason).to_json()})
        except CtxError as exc:
            echo_printable(f"{name}: {exc}", err=True)
            problems.append({"line": None, **exc.to_json()})
        reports.append({"file": name, "valid": not problems, "problems": problems})
    all_valid = all(report["valid"] for report in reports)
    if as_json:
        emit_json({"valid": all_valid, "files": reports})
    sys.exit(EXIT_OK if all_valid else EXIT_REFUSED)


@policy.command()
@click.option(
    "--policy",
    "policy_files",
    multiple=True,
    required=True,
    metavar="FILE",
    type=_POLICY_FILE,
    help="A policy to consult; repeat it to require several layers, e.g. agent and tool.",
)
@click.argument("subject")
@click.argument("object_ref", metavar="CLASS:NAME")
@click.argument("permission", metavar="PERM")
@json_option
def query(
    policy_files: tuple[str, ...], subject: str, object_ref: str, permission: str, as_json: bool
) -> None:
    """Does every --policy allow SUBJECT to PERM on CLASS:NAME?

    Prints 'allow' (exit 0) when every given policy holds the rule
    'allow SUBJECT CLASS:NAME PERM', else 'deny' (exit 1): the two-layer rule of P-6 when
    given the agent's and the tool's policy.  A malformed query or policy (one larger than
    16 MiB included) exits 2 with EINVAL on standard error, and so does a --policy
    FILE that cannot be read, with its errno (ENOENT, EACCES).  --json prints {"decision",
    "rule", "policies": [{"policy", "allows"}]} instead (the error object on a malformed one).

    \b
    Example:
        ctx policy query --policy agent/coder.d/policy \\
            --policy tool/fs.read.d/policy coder_t tool:fs.read execute
    """
    try:
        rule = make_rule(subject, object_ref, permission)
    except CtxError as exc:
        _exit_usage(exc, [f"ctx: {exc}"], as_json)
    layers = []
    for name in policy_files:
        try:
            layers.append(Policy.from_bytes(_read_input(name), source=name))
        except PolicySyntaxError as exc:
            _exit_usage(exc, [str(problem) for problem in exc.problems], as_json)
        except CtxError as exc:
            _exit_usage(exc, [f"ctx: {exc}"], as_json)
    allowed = all_allow(layers, rule)
    if as_json:
        each = [
            {"policy": name, "allows": rule in layer}
            for name, layer in zip(policy_files, layers, strict=True)
        ]
        emit_json({"decision": "allow" if allowed else "deny", "rule": str(rule), "policies": each})
    else:
        click.echo("allow" if allowed else "deny")
    sys.exit(EXIT_OK if allowed else EXIT_REFUSED)


@policy.command()
@click.argument("agent")
@click.argument("object_ref", metavar="CLASS:NAME")
@click.argument("permission", metavar="PERM")
@click.option(
    "--location",
    metavar="DIR",
    help="Storage directory holding a tool (default: where the agent's CTX_PATH finds it, "
    "else tool; or home/UID/tool, shared/SPACE/tool) or a session (home/UID/agent/AGENT/session, "
    "shared/SPACE/agent/AGENT/session; required for sessions), relative to the storage root "
    "or an absolute path within it.",
)
@click.option(
    "--peer",
    metavar="UID:GID",
    help="Explain a request from a process with these credentials "
    "(default: the agent's own identity).",
)
@storage_option
@json_option
@handles_errors
def explain(
    agent: str,
    object_ref: str,
    permission: str,
    location: str | None,
    peer: str | None,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Why may AGENT (not) PERM on CLASS:NAME?  Walks the six steps of the authority chain.

    \b
    Reads the storage root and prints each step and its result:
        1 peer credentials   the caller's uid/gid are the agent's identity
        2 mode bits          Linux owner/group/other bits of the object
        3 mount visibility   the object lies under one of the agent's mounts;
                             through /ctx, not below another home or a space
                             the policy does not let it read (shared:NAME read)
        4 agent label        the agent's subject type; its controls are host-owned
        5 object policy      agent/AGENT.d/policy allows the rule, and grants a
                             mount the object is seen through (mount:NAME read)
        6 tool/model policy  the tool's or model's own policy allows it too

    The first denial decides.  Exit 0 when allowed, 1 when denied, 2 for a malformed request.

    \b
    Example:
        ctx policy explain coder tool:fs.read execute
    """
    try:
        object_class, object_name = split_object_ref(object_ref)
        check_object(object_class, object_name, permission)
        caller = None if peer is None else _parse_peer(peer)
        root = resolve_storage(storage_dir)
        if location is not None and os.path.isabs(location):
            given, location = location, _within_root(root, location)
            check_location(object_class, location, as_given=given)
        if object_class == "tool" and location is None:
            location = _tool_location(root, agent, object_name)
        request = AuthorityRequest(
            root,
            agent,
            object_class,
            object_name,
            permission,
            caller=caller,
            location=location,
        )
        decision = check_authority(request)
    except CtxError as exc:
        if exc.errno == errno.EINVAL:
            raise usage_problem(exc) from None
        raise
    if as_json:
        facts = decision.to_json()
        # The commands a reason suggests act on the root asked about, as an error's do.
        facts["reason"] = for_this_storage(decision.reason)
        for step in facts["steps"]:
            step["detail"] = for_this_storage(step["detail"])
        emit_json({"agent": agent, "object": object_ref, "permission": permission, **facts})
    else:
        _render(agent, object_ref, permission, decision)
    if decision.allowed and object_class == "tool":
        _note_unavailable(root / (location or "tool"), object_name)
    sys.exit(EXIT_OK if decision.allowed else EXIT_REFUSED)


def _note_unavailable(tier: Path, tool: str) -> None:
    """A note when the tool the chain allows, in the tier it judged, cannot run all the same:
    its status is not ``available`` (an administrator disabled it) or it is damaged, which a
    call meets before the chain, and the agent's view leaves out; the chain itself says
    nothing of either."""
    tool_object = ToolObject(tool, tier)
    try:
        require_available(tool_object, read_controls(tool_object))
    except CtxError as refusal:
        echo_printable(
            f"ctx: note: the chain allows it, but a call is refused before the chain: "
            f"{refusal.message}",
            err=True,
        )


def _render(agent: str, object_ref: str, permission: str, decision: Decision) -> None:
    echo_printable(f"agent {agent}: {object_ref} {permission}")
    for result in decision.steps:
        verdict = str(result.outcome)
        if result.errno:
            verdict += f" {errno.errorcode.get(result.errno, result.errno)}"
        detail = for_this_storage(result.detail)
        echo_printable(f"  {int(result.step)} {result.step.title:<18} {verdict:<12} {detail}")
    if decision.allowed:
        click.echo("allow")
    else:
        code = errno.errorcode.get(decision.errno, str(decision.errno))
        echo_printable(f"deny: {code}: {for_this_storage(decision.reason)}")


def _within_root(root: Path, location: str) -> str:
    """An absolute ``--location`` (as ``object which`` and ``object list`` print a tool's
    directory) as the storage root's own path to it, for the chain to judge as it judges
    one given so; EINVAL for one outside the root."""
    for base in (os.fspath(root), os.path.realpath(root)):
        prefix = base.rstrip("/") + "/"
        if location.startswith(prefix) and location != prefix:
            return location[len(prefix) :]
    # Reached through a link to the root (storage/current), as the queue commands take a
    # queue: the part above the root is resolved, never a link below it, which the chain
    # judges as it judges any.  Written as given below it: 'tool/' is still refused.
    place = PurePosixPath(location)
    real_root = os.path.realpath(root)
    for above in reversed(place.parents):  # the shortest first: the root, not a link in it
        if os.path.realpath(above) == real_root:
            return place.relative_to(above).as_posix() + ("/" if location.endswith("/") else "")
    raise invalid(
        f"{location!r} names no directory within the storage root {str(root)!r}; give the one "
        "(tool, home/UID/tool, shared/SPACE/tool, or a session directory)"
    )


def _tool_location(root: Path, agent: str, tool: str) -> str | None:
    """The tier where AGENT's CTX_PATH finds TOOL (T-4), as ``ctx run`` finds it, so that the
    explanation judges the file a call would run; None (the system tier) when the agent or
    the tool is not found, which the chain then reports.

    The search looks with this process's rights and passes over a directory it may not
    enter.  Where the agent's own would not (a space whose group this user is not in), the
    tool found after it, or none, need not be the agent's: EACCES naming that directory,
    rather than a verdict on another file (:func:`refusal_of_this_process`).  So too when
    it may not read the agent's label or policy, which decide the spaces on that CTX_PATH."""
    try:
        view = AgentView.load(root, agent)
    except CtxError:
        return None
    question = f"execute tool:{tool}"
    try:
        view.facts.granting_policy()
    except UnreadableControl as exc:
        refusal = refusal_of_this_process(view.facts, question, root / exc.path, exc.refusal)
        if refusal is not None:
            raise refusal from None
    except CtxError:
        pass  # the agent's own problem: the chain denies for it at its step
    found = view.find_tool(tool)
    for directory in view.tool_directories():
        if found is not None and directory == found.directory:
            break
        try:
            os.lstat(directory / tool)
        except OSError as exc:
            refusal = refusal_of_this_process(view.facts, question, directory / tool, exc)
            if refusal is not None:
                raise refusal from None
    return None if found is None else tier_location(root, found.directory)


def _read_input(name: str) -> bytes:
    """The policy FILE (or standard input for '-'); EINVAL, a malformed policy (P-8), when it
    holds more than :data:`MAX_POLICY_BYTES`, of which no more than one byte past is read, or
    when FILE is not a regular file: a FIFO is not waited on (a pipe is given as '-')."""
    data = _standard_input() if name == STDIN else _read_file(name)
    if len(data) > MAX_POLICY_BYTES:
        raise invalid(_too_long(name))
    return data


def _read_file(name: str) -> bytes:
    try:
        return read_regular_file(name, MAX_POLICY_BYTES, follow_link=True)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise invalid(_too_long(name)) from None
        if exc.errno == errno.EINVAL:
            raise invalid(
                f"{name} is not a regular file (a FIFO, device or directory); give a policy "
                f"file, or '{STDIN}' to read one from a pipe"
            ) from None
        raise CtxError(exc.errno or errno.EIO, f"cannot read {name}: {exc.strerror}") from None


def _too_long(name: str) -> str:
    return f"{name} holds more than {MAX_POLICY_BYTES} bytes, more than a policy may"


@functools.cache
def _standard_input() -> bytes:
    """Standard input, read once: '-' given twice names the same policy twice, not the
    policy and then an empty one (which, as a layer, would deny everything)."""
    require_standard_input("policy")  # closed, it would be a valid policy nobody gave
    try:
        return read_up_to(sys.stdin.fileno(), MAX_POLICY_BYTES)
    except OSError as exc:
        raise CtxError(exc.errno or errno.EIO, f"cannot read {STDIN}: {exc.strerror}") from None


def _parse_peer(peer: str) -> Credentials:
    uid, colon, gid = peer.partition(":")
    if not (colon and is_decimal(uid) and is_decimal(gid)):
        raise invalid(f"--peer {shown_number(peer)} must be UID:GID, e.g. 1000:1000")
    ids = decimal_value(uid), decimal_value(gid)
    if ids[0] is None or ids[1] is None or max(ids) > MAX_ID:
        raise invalid(f"--peer {shown_number(peer)}: a uid or gid is at most {MAX_ID}")
    return Credentials(*ids)


def _exit_usage(error: CtxError, lines: list[str], as_json: bool) -> NoReturn:
    for line in lines:
        echo_printable(line, err=True)
    if as_json:
        emit_json_error(error)  # stays exit 2 when the object cannot be written (P-8)
    sys.exit(EXIT_USAGE)
