"""The run capability: what the host does, during one call, for the tool it runs (SPEC A-5).

Some core tools need the host to act for them: ``agent.update`` rewrites a control of the
calling agent, which the agent's uid may not write.  For such a call the runner hands the tool
one end of a socket pair (:class:`Capability`), bound to that call's agent; the tool sends one
JSON request per line, the host answers each with one JSON line.  The binding is the receipt:
the tool never names the agent, so an agent can change only its own controls, and only while
its own call runs.

``agent.update`` replaces exactly one of the caller's ``system.md`` or ``prompt.template.md``
with at most :data:`MAX_UPDATE_BYTES` of UTF-8 text, atomically; any other control is EINVAL.
It changes what the next run's prompt is rendered from, nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cortexfs import durable
from cortexfs.errors import CtxError, invalid, too_big

ENVIRONMENT = "CTX_RUN_CAPABILITY"  # the descriptor number, in the tool's environment
UPDATABLE = ("system.md", "prompt.template.md")
MAX_UPDATE_BYTES = 8 * 1024
_MAX_LINE = 64 * 1024


class Capability:
    """One call's capability: the tool's end to pass on, the host's end served meanwhile."""

    def __init__(self, root: Path, agent: str) -> None:
        self.root, self.agent = root, agent
        self._host, self._tool = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="capability", daemon=True)

    @property
    def tool_descriptor(self) -> int:
        return self._tool.fileno()

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

    def _serve(self) -> None:
        with contextlib.suppress(OSError), self._host.makefile("rwb") as channel:
            for line in channel:
                if len(line) > _MAX_LINE:
                    return
                channel.write(json.dumps(self.answer(line)).encode() + b"\n")
                channel.flush()

    def answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or request.get("op") != "agent.update":
                raise invalid("the capability answers one request: agent.update")
            return {"ok": True, **update_control(self.root, self.agent, request)}
        except CtxError as error:
            return error.to_json()
        except ValueError as exc:
            return invalid(f"the request is not JSON: {exc}").to_json()


def update_control(root: Path, agent: str, request: dict[str, Any]) -> dict[str, Any]:
    """A-5: replace ``agent``'s ``system.md`` or ``prompt.template.md``, atomically."""
    control, content = request.get("control"), request.get("content")
    if control not in UPDATABLE:
        raise invalid(
            f"agent.update changes only {' or '.join(UPDATABLE)}, not {control!r}: every other "
            "control belongs to the host"
        )
    if not isinstance(content, str):
        raise invalid("'content' must be a string")
    data = content.encode("utf-8")
    if len(data) > MAX_UPDATE_BYTES:
        raise too_big(f"{control} may hold at most {MAX_UPDATE_BYTES} bytes, not {len(data)}")
    ops = durable.default_ops()
    directory = durable.open_dir_path(ops, str(root / "agent" / f"{agent}.d"))
    try:
        temporary = f".{control}.{os.urandom(6).hex()}.tmp"
        durable.write_file_synced(ops, directory, temporary, data, 0o644)
        os.chmod(temporary, 0o644, dir_fd=directory)
        durable.replace_synced(ops, directory, temporary, directory, control)
    except OSError as exc:
        reason = f"cannot replace {control}: {exc.strerror}"
        raise CtxError(exc.errno or errno.EIO, reason) from None
    finally:
        ops.close(directory)
    return {"agent": agent, "control": control, "bytes": len(data)}
