"""Policy v0 and the authority chain (SPEC §5, P-1..P-8).

* :mod:`~cortexfs.policy.grammar` — the language: one ``allow`` rule per line (P-1..P-4).
* :mod:`~cortexfs.policy.decision` — :class:`Policy`, a rule set: default deny, one set lookup
  per decision, no I/O (P-2, P-6).
* :mod:`~cortexfs.policy.chain` — :func:`check_authority`, the six steps of P-5 over a storage
  root, and :func:`check_tool_execute`, the tool runner's two-layer question (P-6);
  :func:`caller_refusal`, step 1 alone, asked before anything is made for a request;
  :func:`refusal_of_this_process`, the error for what the asking process, not the agent,
  may not read; :class:`AgentFacts` reads an agent's controls once for many questions.

The chain's helpers: :mod:`~cortexfs.policy.objects` (where each object lives and which mode
bits each permission needs), :mod:`~cortexfs.policy.linux` (credentials and mode bits),
:mod:`~cortexfs.policy.mounts` (mount visibility), :mod:`~cortexfs.policy.controls` (the
agent's host-owned controls) and :mod:`~cortexfs.beneath` (walking without links).
"""

from cortexfs.policy.chain import (
    AgentFacts,
    AuthorityRequest,
    Decision,
    Outcome,
    Step,
    StepResult,
    caller_refusal,
    check_authority,
    check_tool_execute,
    refusal_of_this_process,
)
from cortexfs.policy.decision import Policy, all_allow, tool_execute_allowed
from cortexfs.policy.grammar import (
    CLASS_PERMISSIONS,
    PolicyProblem,
    PolicySyntaxError,
    Rule,
    make_rule,
    parse_rule,
    parse_rules,
    parse_rules_bytes,
)
from cortexfs.policy.linux import Credentials, Identity

__all__ = [
    "CLASS_PERMISSIONS",
    "AgentFacts",
    "AuthorityRequest",
    "Credentials",
    "Decision",
    "Identity",
    "Outcome",
    "Policy",
    "PolicyProblem",
    "PolicySyntaxError",
    "Rule",
    "Step",
    "StepResult",
    "all_allow",
    "caller_refusal",
    "check_authority",
    "check_tool_execute",
    "make_rule",
    "parse_rule",
    "parse_rules",
    "parse_rules_bytes",
    "refusal_of_this_process",
    "tool_execute_allowed",
]
