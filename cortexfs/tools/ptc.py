"""Programmatic tool calling: the gates it would need, decided here and never opened (SPEC §11).

CortexFS does not enable programmatic tool calling (C-1): the host loop makes one tool call at
a time, never announces a ``programmatic_tool_calling`` tool or ``allowed_callers``, and never
reads a tool's ``schema`` as an output schema.  A ``program`` control (C-2) is validated and
grants nothing.  What a host would have to check before it could enable the feature is written
down here as pure decisions (C-3), so that the rules exist and are tested; :data:`HOST_ENABLES`
is False and nothing in the runner consults this module.

Two decisions, both failing closed:

* :func:`may_advertise` — whether one tool may be offered to a model as a programmatic callee.
  Every gate must hold; the first that does not is the reason to fall back to the ordinary
  host loop.  Nothing is inferred from a tool's name, policy, input schema or MCP origin.
* :func:`nested_call_outcome` — what the host does with each nested call of a programmatic
  turn: the fail-closed table of the original design text, row by row, in the order a host
  must apply it (a malformed turn is rejected before any duplicate is looked for, a duplicate
  before anything is authorized, and so on).  The table's last row needs no function: a
  ``program_output`` and the final assistant message are judged apart, and neither one's
  validity vouches for the other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from cortexfs.tools.controls import cap_fact

HOST_ENABLES = False  # C-1: this host never advertises programmatic tool calling

MAX_IDENTITY_BYTES = 256
_IDENTITY = re.compile(r"[!-~]+")  # printable ASCII, no spaces: opaque, bounded provider facts


class Candidate(NamedTuple):
    """What a host knows about one tool, for one run, when it decides what to advertise."""

    route_supports: bool  # the provider/model route declares programmatic tool calling
    model_supports: bool  # ... and so does the model chosen for this run
    program_valid: bool  # tool/<name>.d/program is present and valid (C-2), within the limits
    declared: bool  # the tool is declared to the model for this run
    resolved: bool  # its name resolves through CTX_PATH
    authorized: bool  # the effective authority chain allows the call (P-5, P-6)
    approval_auto: bool  # the run's approval mode is auto
    needs_ask: bool  # a call of this tool would ask for approval
    side_effects: bool  # has_side_effects(cap), or any external write


def has_side_effects(cap: Mapping[str, Any]) -> bool:
    """``cap.side_effects`` as a gate reads it: a ``cap`` that does not say counts as having
    side effects (T-8), so the gate fails closed."""
    return cap_fact(cap, "side_effects")


class Verdict(NamedTuple):
    allowed: bool
    reason: str


def may_advertise(candidate: Candidate, *, host_enables: bool = HOST_ENABLES) -> Verdict:
    """Whether ``candidate`` may be named in ``allowed_callers``; otherwise the reason to fall
    back to the ordinary host loop (the first gate that fails).

    A gate holds only on the boolean it needs: ``"false"``, ``None``, ``1`` or a list say
    nothing a host may rely on, so they fail it, whichever way the gate reads."""
    gates = (
        (host_enables is True, "this host does not enable programmatic tool calling (C-1)"),
        (
            candidate.route_supports is True,
            "the provider route does not declare programmatic calling",
        ),
        (candidate.model_supports is True, "the model does not declare programmatic calling"),
        (candidate.program_valid is True, "the tool has no valid program control (C-2)"),
        (candidate.declared is True, "the tool is not declared for this run"),
        (candidate.resolved is True, "the tool does not resolve through CTX_PATH"),
        (candidate.authorized is True, "the authority chain does not allow the tool"),
        (candidate.approval_auto is True, "the run's approval mode is not auto"),
        (candidate.needs_ask is False, "a call of the tool would ask for approval"),
        (candidate.side_effects is False, "the tool has side effects or writes outside"),
    )
    for holds, reason in gates:
        if not holds:
            return Verdict(False, f"{reason}: use the ordinary host loop")
    return Verdict(True, "every gate holds")


# What the host does with one nested call of a programmatic turn.
REJECT_TURN = "reject the provider turn; execute nothing"
REJECT_DUPLICATE = "reject before authorization; never execute twice"
STOP_CANCELLED = "stop the work in preparation, record the cancellation, do not continue"
UNAVAILABLE = "programmatic calling is unavailable: record the host's refusal, return no result"
RECORD_FAILURE = "record the normalised failure; emit no program_output"
EMIT_OUTPUT = "emit the bounded program_output continuation"


class NestedCall(NamedTuple):
    """What happened to one nested call, as the host saw it."""

    program_item: object  # the provider's identities, opaque to CortexFS
    caller: object
    call_id: object
    continuation: object
    duplicate: bool  # the program or the nested call id was seen before in this turn
    cancelled: bool  # cancelled before, during or after the call
    interrupted: bool  # an unexpected or denied Ask, a timeout, EOF, a malformed response
    tool_ok: bool  # the tool succeeded
    output_matches_program: bool  # the normalised result passes the program's output schema


def identity_problem(value: object) -> str | None:
    """Why a provider identity is unusable (missing, malformed, too long); None if usable."""
    if not isinstance(value, str) or not value:
        return "missing"
    if len(value.encode()) > MAX_IDENTITY_BYTES:
        return f"longer than {MAX_IDENTITY_BYTES} bytes"
    if not _IDENTITY.fullmatch(value):
        return "not printable ASCII without spaces"
    return None


def nested_call_outcome(call: NestedCall) -> str:
    """The fail-closed table, in the order the host applies it; only a call that passes every
    row emits its output.  A fact that is not the boolean it should be counts against the
    call: a ``duplicate`` of ``None`` is a duplicate, a ``tool_ok`` of ``"true"`` no success."""
    identities = (call.program_item, call.caller, call.call_id, call.continuation)
    if any(identity_problem(value) for value in identities):
        return REJECT_TURN
    if call.duplicate is not False:
        return REJECT_DUPLICATE
    if call.cancelled is not False:
        return STOP_CANCELLED
    if call.interrupted is not False:
        return UNAVAILABLE
    if not (call.tool_ok is True and call.output_matches_program is True):
        return RECORD_FAILURE
    return EMIT_OUTPUT


def duplicates(ids: Iterable[str]) -> set[str]:
    """The ids that occur more than once (program ids, nested call ids of one turn)."""
    seen: set[str] = set()
    repeated = set()
    for value in ids:
        (repeated if value in seen else seen).add(value)
    return repeated
