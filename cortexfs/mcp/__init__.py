"""MCP servers as tool sources: ``ctxmcp`` (SPEC §10, M-1..M-4).

An MCP server is a *source* of tools, never a root object: there is no ``/ctx/mcp``.
``ctxmcp`` talks to one explicitly chosen **stdio** server (:mod:`~cortexfs.mcp.client`),
lists its tools, and projects them into v2 manifest *candidates*
(:mod:`~cortexfs.mcp.project`), written as files in a directory the caller names
(:mod:`~cortexfs.mcp.candidates`), each naming its tool
``<server>.<remote_tool>`` and locating it with a strict ``mcp`` locator.  It installs
nothing, grants nothing and writes nothing under the storage root; installing a candidate is
the ordinary ``ctx object install``.  The server's configuration (command, arguments,
environment, secrets) stays where it is: a candidate names the configuration file as the
agent will see it, never its contents.
"""

# M-2: the version this client announces, and the negotiated versions it accepts.
ANNOUNCED_VERSION = "2025-11-25"
ACCEPTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
