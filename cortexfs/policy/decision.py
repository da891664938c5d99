"""Deciding with policy v0 (SPEC P-2, P-6): default deny, one set lookup per decision.

A :class:`Policy` is the set of its rules.  A permission is granted when the exact rule
``allow SUBJECT CLASS:NAME PERM`` is in the set — no matching, no ordering, no precedence, so
duplicate rules are harmless and the order of lines never matters.  This module does no I/O:
the authority chain (:mod:`cortexfs.policy.chain`) gathers the facts and asks here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cortexfs.policy.grammar import Rule, parse_rules, parse_rules_bytes


class Policy:
    """An immutable policy v0 rule set."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules = frozenset(rules)

    @classmethod
    def from_text(cls, text: str, source: str = "<policy>") -> Policy:
        return cls(parse_rules(text, source))

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<policy>") -> Policy:
        return cls(parse_rules_bytes(data, source))

    def allows(self, subject: str, object_class: str, object_name: str, permission: str) -> bool:
        """True only when this exact rule is present (default deny, P-2)."""
        # A Rule is a tuple, so a plain tuple finds it without building a Rule per decision.
        return (subject, object_class, object_name, permission) in self._rules

    def __contains__(self, rule: object) -> bool:
        return rule in self._rules

    def __iter__(self) -> Iterator[Rule]:
        return iter(sorted(self._rules))

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"Policy({len(self._rules)} rules)"


def all_allow(policies: Iterable[Policy], rule: Rule) -> bool:
    """Every policy grants ``rule`` (the layered rule of P-6 and ``ctx policy query``).

    No policy at all grants nothing: an empty list of layers is a denial, not a pass.
    """
    granted = False
    for policy in policies:
        if rule not in policy:
            return False
        granted = True
    return granted


def tool_execute_allowed(agent_policy: Policy, tool_policy: Policy, label: str, tool: str) -> bool:
    """P-6: a tool runs only when the agent's and the tool's own policy both allow it."""
    return all_allow((agent_policy, tool_policy), Rule(label, "tool", tool, "execute"))
