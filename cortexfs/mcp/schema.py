"""Whether a server's ``inputSchema`` can be a tool's ``schema`` (T-1, M-3).

A candidate is written so that ``ctx object check`` and ``ctx object install`` accept it and
every call can be checked against its schema.  Beyond being a JSON Schema that admits an
object (:mod:`~cortexfs.mcp.project`), the schema must therefore:

* nest no deeper than the manifest reader allows, one level below the manifest's own
  (:data:`MAX_SCHEMA_DEPTH`): deeper, the candidate is refused by ``ctx object check``, and a
  recursive check of it runs out of stack;
* hold no lone surrogate: JSON can spell ``"\\ud800"``, but no UTF-8 file holds it;
* resolve every reference inside itself, as every tool's schema must
  (:mod:`cortexfs.tools.schema_references`, which :func:`cortexfs.tools.schemas.schema_problems`
  asks).

Each check walks the schema iteratively: it must hold for a schema too deep to recurse into.
"""

from __future__ import annotations

from typing import Any

from cortexfs import jsontext

# The manifest is one object holding the schema: the schema gets one level fewer.
MAX_SCHEMA_DEPTH = jsontext.MAX_DEPTH - 1


def schema_problem(schema: Any, what: str = "its inputSchema") -> str | None:
    """Why ``schema`` cannot be written into a candidate, or None (see above)."""
    if isinstance(schema, dict | list) and jsontext.nested_deeper(schema, MAX_SCHEMA_DEPTH):
        return (
            f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels; a manifest may nest at most "
            f"{jsontext.MAX_DEPTH}, so 'ctx object check' would refuse the candidate"
        )
    character = jsontext.lone_surrogate(schema)
    if character is not None:
        return f"{what} holds {character!r}, a lone surrogate, which is not a character"
    return None
