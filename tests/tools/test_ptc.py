"""Programmatic tool calling stays off, and its gates fail closed (SPEC C-1, C-3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortexfs.tools import ptc

GATES = {  # field -> the value that holds
    "route_supports": True,
    "model_supports": True,
    "program_valid": True,
    "declared": True,
    "resolved": True,
    "authorized": True,
    "approval_auto": True,
    "needs_ask": False,
    "side_effects": False,
}
EVERY_GATE_HOLDS = ptc.Candidate(**GATES)
GOOD_CALL = ptc.NestedCall(
    program_item="prog_1",
    caller="call_parent",
    call_id="call_7",
    continuation="resp_42",
    duplicate=False,
    cancelled=False,
    interrupted=False,
    tool_ok=True,
    output_matches_program=True,
)


def test_this_host_never_advertises() -> None:
    verdict = ptc.may_advertise(EVERY_GATE_HOLDS)

    assert ptc.HOST_ENABLES is False
    assert not verdict.allowed and "(C-1)" in verdict.reason


def test_a_host_that_enabled_it_would_advertise_only_past_every_gate() -> None:
    assert ptc.may_advertise(EVERY_GATE_HOLDS, host_enables=True).allowed


@pytest.mark.parametrize("gate", sorted(GATES))
def test_each_gate_alone_falls_back_to_the_host_loop(gate: str) -> None:
    candidate = EVERY_GATE_HOLDS._replace(**{gate: not GATES[gate]})

    verdict = ptc.may_advertise(candidate, host_enables=True)

    assert not verdict.allowed
    assert verdict.reason.endswith("use the ordinary host loop")


@given(st.fixed_dictionaries({gate: st.booleans() for gate in GATES}), st.booleans())
def test_advertised_exactly_when_every_gate_holds(facts: dict[str, bool], enabled: bool) -> None:
    verdict = ptc.may_advertise(ptc.Candidate(**facts), host_enables=enabled)

    assert verdict.allowed == (enabled and facts == GATES)


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ({}, ptc.EMIT_OUTPUT),
        ({"call_id": None}, ptc.REJECT_TURN),
        ({"caller": ""}, ptc.REJECT_TURN),
        ({"program_item": "x" * (ptc.MAX_IDENTITY_BYTES + 1)}, ptc.REJECT_TURN),
        ({"continuation": "resp 42"}, ptc.REJECT_TURN),
        ({"call_id": 7}, ptc.REJECT_TURN),
        ({"duplicate": True}, ptc.REJECT_DUPLICATE),
        ({"cancelled": True}, ptc.STOP_CANCELLED),
        ({"interrupted": True}, ptc.UNAVAILABLE),
        ({"tool_ok": False}, ptc.RECORD_FAILURE),
        ({"output_matches_program": False}, ptc.RECORD_FAILURE),
        # Precedence: a malformed turn is rejected whatever else is wrong with it; a duplicate
        # is refused before a cancellation or a failure could be recorded for it.
        ({"call_id": None, "duplicate": True, "cancelled": True}, ptc.REJECT_TURN),
        ({"duplicate": True, "cancelled": True, "tool_ok": False}, ptc.REJECT_DUPLICATE),
        ({"cancelled": True, "interrupted": True}, ptc.STOP_CANCELLED),
        ({"interrupted": True, "tool_ok": False}, ptc.UNAVAILABLE),
    ],
)
def test_the_fail_closed_table(change: dict[str, object], outcome: str) -> None:
    assert ptc.nested_call_outcome(GOOD_CALL._replace(**change)) == outcome


@given(
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.text(max_size=8)),
)
def test_only_a_clean_call_emits_output(
    duplicate: bool,
    cancelled: bool,
    interrupted: bool,
    tool_ok: bool,
    matches: bool,
    call_id: str | None,
) -> None:
    call = GOOD_CALL._replace(
        duplicate=duplicate,
        cancelled=cancelled,
        interrupted=interrupted,
        tool_ok=tool_ok,
        output_matches_program=matches,
        call_id=call_id,
    )
    clean = (
        ptc.identity_problem(call_id) is None
        and not (duplicate or cancelled or interrupted)
        and tool_ok
        and matches
    )

    assert (ptc.nested_call_outcome(call) == ptc.EMIT_OUTPUT) == clean


def test_duplicates_are_found_among_the_ids_of_a_turn() -> None:
    assert ptc.duplicates(["a", "b", "a", "c", "b", "a"]) == {"a", "b"}
    assert ptc.duplicates(["a", "b"]) == set()


@pytest.mark.parametrize("cap", [{}, {"network": False}, {"side_effects": True}])
def test_a_cap_that_does_not_rule_out_side_effects_closes_the_gate(cap: dict[str, bool]) -> None:
    candidate = EVERY_GATE_HOLDS._replace(side_effects=ptc.has_side_effects(cap))

    verdict = ptc.may_advertise(candidate, host_enables=True)

    assert not verdict.allowed and "side effects" in verdict.reason


def test_a_cap_that_declares_no_side_effects_opens_the_gate() -> None:
    candidate = EVERY_GATE_HOLDS._replace(
        side_effects=ptc.has_side_effects({"side_effects": False})
    )

    assert ptc.may_advertise(candidate, host_enables=True).allowed
