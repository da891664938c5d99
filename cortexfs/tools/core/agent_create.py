"""``agent.create``: the calling agent creates a child agent with less than it holds (SPEC A-4).

Input: an agent request (A-3) — ``name``, ``label``, ``tools``, ``model``, ``shared``,
``mount``.  The tool asks the host over the run capability (``CTX_RUN_CAPABILITY``), which
attenuates: the caller must hold ``agent:<child> create``, every grant of the child must be
one the caller may use itself through the whole authority chain (both layers of P-6), the
child's label is never another existing agent's, every mount must lie inside one of the
caller's visible mounts (``rw`` only where the caller's is), and the child runs as the
caller's uid and groups.  Native
output ``{"agent", "label", "uid", "warnings"}``: ``warnings`` lists what ``ctx agent create``
would have warned a person of (:func:`cortexfs.agents.create.warnings_for`: a read-write mount
through which the child could change its own controls, a source recorded as the real path
another uid's symbolic link chose, …); terminal mode prints them on stderr, one
``agent.create: warning: …`` line each.  Without the runner it refuses (EPERM).

Bad input exits 2 wherever it is found: the schema check here sees only the request's shape,
and the host validates the rest as ``ctx agent create`` does (an illegal name, a tool named
twice, ``..`` in a mount source), answering EINVAL, which is only ever a fault of the request.
"""

from __future__ import annotations

from cortexfs.printable import printable
from cortexfs.tools.core.hostcall import COUNT, TEXT, TEXTS, ask_host
from cortexfs.tools.core.toolio import Reply, core_main, main_parameter


def create(request: dict[str, object], native: bool) -> Reply:
    facts = {"agent": TEXT, "label": TEXT, "uid": COUNT, "warnings": TEXTS}
    answer = ask_host("agent.create", {"op": "agent.create", "request": request}, facts)
    warnings = answer["warnings"]
    return Reply(
        answer,
        text=f"created agent {answer['agent']}\n".encode(),
        # A warning quotes the request's paths, which may hold control bytes: escaped, as
        # `ctx agent create` shows them.
        stderr="".join(
            f"agent.create: warning: {printable(warning)}\n" for warning in warnings
        ).encode(),
    )


def run() -> int:
    return core_main("agent.create", main_parameter("name"), create)
