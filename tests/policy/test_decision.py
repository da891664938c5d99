"""Deciding with a rule set: default deny, exact match, two layers (SPEC P-2, P-6, P-7)."""

from __future__ import annotations

from cortexfs.policy import Policy, Rule, all_allow, tool_execute_allowed

CODER = Policy.from_text(
    """
    allow coder_t tool:fs.read execute
    allow coder_t model:openai/gpt-5.6 use
    allow coder_t agent:reviewer create
    """
)


def test_only_the_exact_rule_allows() -> None:
    assert CODER.allows("coder_t", "tool", "fs.read", "execute")
    assert not CODER.allows("coder_t", "tool", "fs.write", "execute")
    assert not CODER.allows("reviewer_t", "tool", "fs.read", "execute")
    assert not CODER.allows("coder_t", "model", "openai/gpt-5.7", "use")


def test_permission_is_by_concrete_name() -> None:
    # P-7: a grant for agent:reviewer says nothing about any other child.
    assert CODER.allows("coder_t", "agent", "reviewer", "create")
    assert not CODER.allows("coder_t", "agent", "reviewer", "start")
    assert not CODER.allows("coder_t", "agent", "reviewer-2", "create")
    assert not CODER.allows("coder_t", "agent", "*", "create")


def test_an_empty_policy_denies_everything_including_the_network() -> None:
    assert not Policy().allows("coder_t", "network", "default", "connect")


def test_duplicates_and_order_change_nothing() -> None:
    lines = ["allow coder_t tool:fs.read execute", "allow coder_t tool:fs.stat execute"]
    once = Policy.from_text("\n".join(lines))
    twice = Policy.from_text("\n".join([*reversed(lines), *lines, lines[0]]))
    assert len(once) == len(twice) == 2
    assert list(once) == list(twice)


def test_every_layer_must_allow() -> None:
    rule = Rule("coder_t", "tool", "fs.read", "execute")
    granting = Policy([rule])
    assert all_allow([granting], rule)
    assert all_allow([granting, granting], rule)
    assert not all_allow([granting, Policy()], rule)
    assert not all_allow([], rule)


def test_a_tool_runs_only_when_agent_and_tool_policy_both_allow() -> None:
    tool_policy = Policy.from_text("allow coder_t tool:fs.read execute")
    assert tool_execute_allowed(CODER, tool_policy, "coder_t", "fs.read")
    assert not tool_execute_allowed(CODER, Policy(), "coder_t", "fs.read")
    assert not tool_execute_allowed(Policy(), tool_policy, "coder_t", "fs.read")
    assert not tool_execute_allowed(CODER, tool_policy, "reviewer_t", "fs.read")
