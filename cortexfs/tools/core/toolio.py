"""What every core tool program shares: its input, its output, its failures (SPEC T-2, T-3).

Input is one JSON object, taken from the first argument when there is one
(``fs.read '{"path":"README.md"}'``) and from stdin otherwise
(``echo '{"cmd":"pwd"}' | shell.exec``).  Arguments that are not a JSON object are the tool's
*shorthand*: by default one argument, the main parameter (``fs.read README.md`` means
``{"path": "README.md"}``); a tool may read its own (``tsh.config key=value…``,
``fs.write PATH < FILE``).  No argument and nothing on stdin (empty, or a terminal) is the
empty object: ``tsh.config`` alone shows the configuration, ``fs.read`` alone says that
``path`` is required.

A core tool's input is then checked against the input schema of its manifest, the very file
``ctx bootstrap`` writes its ``schema`` control from (bundled with the program), in every
mode: a missing required key, an unknown key or a value of the wrong type is refused before
the tool does anything, whether or not ``ctx run --native`` checked it before starting the
tool.

Output depends on the mode the runner sets in ``CTX_MODE``: ``native`` prints one JSON object
on stdout; anything else (terminal CLI mode, or a person running the tool directly) prints
plain text.  A failure prints ``<tool>: <ERRNO>: <sentence>`` on stderr — in native mode also
``{"error": "<ERRNO>", "errno": N, "message": …}`` on stdout — and exits 1, or 2 when the
input itself was wrong.

Every call of a core tool is a process of its own, so the records here and in
:mod:`~cortexfs.tools.core.confine` are ``NamedTuple``s: a dataclass would import
:mod:`inspect`, which takes longer than a whole ``fs.stat``'s work.
"""

from __future__ import annotations

import errno as errno_names
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from cortexfs import jsontext
from cortexfs.errors import out_of_memory
from cortexfs.printable import printable
from cortexfs.standard_streams import discard_output, standard_input

NATIVE = "native"
MAX_INPUT_BYTES = 16 * 1024 * 1024
REQUIRED = object()


class ToolFailure(Exception):
    """A refusal with an errno; ``usage`` marks a problem with the input (exit status 2)."""

    def __init__(self, code: int, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.errno = code
        self.message = message
        self.usage = usage


class Reply(NamedTuple):
    """What a tool answers: ``data`` in native mode, ``text`` (bytes) in terminal mode."""

    data: dict[str, Any]
    text: bytes = b""
    exit_status: int = 0
    stderr: bytes = b""


Handler = Callable[[dict[str, Any], bool], Reply]
# The request that arguments which are not a JSON object stand for (see main_parameter).
Shorthand = Callable[[list[str]], dict[str, Any]]


def main(
    tool: str,
    shorthand: Shorthand,
    handler: Handler,
    argv: list[str] | None = None,
    program: str | None = None,
    *,
    schema: Mapping[str, Any] | None = None,
) -> int:
    """Parse the input, check it against ``schema``, call ``handler(request, native)``,
    render its reply or failure.

    A core tool passes its own input schema (:func:`core_main`).  ``program`` is the command
    this tool's code runs inside, if any (``ctx`` for ``ctx tool``): its errors then read as
    that command's do, ``ctx: EINVAL: tsh.config: …``.
    """
    arguments = sys.argv[1:] if argv is None else argv
    native = os.environ.get("CTX_MODE") == NATIVE
    try:
        request = read_request(arguments, shorthand)
        if schema is not None:
            check_input(tool, schema, request)
        reply = handler(request, native)
    except ToolFailure as failure:
        return _fail(tool, failure, native, program)
    except OSError as exc:
        reason = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror or str(exc)
        return _fail(tool, ToolFailure(exc.errno or errno_names.EIO, reason), native, program)
    except MemoryError:
        # The host's memory or this process's limit of it ran out (a large input, an MCP
        # server's huge answer): a shortage told by its errno, as any other, not a traceback.
        reason = out_of_memory(f"{tool} stopped").message
        return _fail(tool, ToolFailure(errno_names.ENOMEM, reason), native, program)
    except UnicodeEncodeError as exc:  # JSON can spell "\ud800"; no name or text holds it
        character = exc.object[exc.start : exc.end]
        reason = f"the input holds {character!r}, a lone surrogate, which is not a character"
        failure = ToolFailure(errno_names.EINVAL, reason, usage=True)  # the input is wrong
        return _fail(tool, failure, native, program)
    lost = _write_output(tool, json_line(reply.data) if native else reply.text, program)
    if not native:
        sys.stderr.buffer.write(reply.stderr)
    return reply.exit_status if lost is None else lost


# The reader of the output left (`fs.read F | head -c 10`): 128 + SIGPIPE, quietly, as a shell
# reports a command that SIGPIPE ended (and as ``ctx`` does).
EXIT_READER_GONE = 141
# The output could not be written (a full disk, ``> /dev/full``): EX_IOERR, as ``ctx`` says it.
EXIT_OUTPUT_FAILED = 74


def _write_output(tool: str, data: bytes, program: str | None) -> int | None:
    """Write ``data`` on stdout; None when it was written, else the exit status that says why
    not (:data:`EXIT_READER_GONE`, :data:`EXIT_OUTPUT_FAILED` with a line on stderr), never a
    traceback.  What stdout still buffers is dropped then, so that the interpreter's last
    flush does not fail again (exit 120)."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        discard_output(sys.stdout)
        return EXIT_READER_GONE
    except OSError as exc:
        discard_output(sys.stdout)
        code = exc.errno or errno_names.EIO
        reason = f"cannot write standard output ({exc.strerror or 'I/O error'})"
        _say(tool, errno_names.errorcode.get(code, f"E{code}"), reason, program)
        return EXIT_OUTPUT_FAILED
    return None


def core_main(
    tool: str,
    shorthand: Shorthand,
    handler: Handler,
    argv: list[str] | None = None,
    program: str | None = None,
) -> int:
    """:func:`main` for the core tool ``tool``, its input checked against its own schema."""
    return main(tool, shorthand, handler, argv, program, schema=core_schema(tool))


def json_line(data: Any) -> bytes:
    """``data`` as one line of JSON in UTF-8.  A file name that is not UTF-8 reaches Python as
    lone surrogates (``\udcff`` for the byte 0xff): a reply holding one is written all
    escaped, so that the name comes back to a tool as it went out."""
    return jsontext.dumps_utf8(data) + b"\n"


def read_request(arguments: list[str], shorthand: Shorthand) -> dict[str, Any]:
    if arguments:
        if not arguments[0].lstrip().startswith("{"):
            return shorthand(arguments)
        if len(arguments) > 1:
            raise ToolFailure(errno_names.EINVAL, "expected one JSON object", usage=True)
        return _parse_object(arguments[0])
    data = read_stdin(MAX_INPUT_BYTES, "input", line_end=True)
    if not data.strip():
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Never replaced: fs.write or agent.update would write U+FFFD where the byte was.
        raise ToolFailure(
            errno_names.EINVAL, f"input is not UTF-8 text (byte {exc.start} is not)", usage=True
        ) from None
    return _parse_object(text)


def main_parameter(key: str) -> Shorthand:
    """The default shorthand: one argument, the value of ``key`` (``fs.read README.md``)."""

    def request(arguments: list[str]) -> dict[str, Any]:
        if len(arguments) > 1:
            raise ToolFailure(
                errno_names.EINVAL, "expected one argument (a JSON object or a value)", usage=True
            )
        return {key: arguments[0]}

    return request


def read_stdin(limit: int, what: str, *, line_end: bool = False) -> bytes:
    """Everything piped in on stdin, at most ``limit`` bytes (else EFBIG); nothing when stdin
    is a terminal (a person typed the bare command) or closed.  ``line_end``: a line break
    after the ``limit`` bytes is not counted (the runner ends a native input with one)."""
    if sys.stdin is None or sys.stdin.isatty():
        return b""
    data = standard_input().read(limit + 2)  # whole, from a non-blocking pipe too
    if len(data) > limit and not (line_end and len(data) == limit + 1 and data[-1:] == b"\n"):
        raise ToolFailure(errno_names.EFBIG, f"{what} is larger than {limit} bytes")
    return data


def core_schema(tool: str) -> dict[str, Any]:
    """The input schema of the core tool ``tool``: the one in its manifest, from which
    ``ctx bootstrap`` writes the ``schema`` control, so the two cannot drift.  The manifest
    is read through this module's loader, from the program's own archive when it runs as
    one (cortexfs.tools.core.launcher bundles it) and from the package inside ``ctx``."""
    where = os.path.join(os.path.dirname(__file__), "manifests", f"{tool}.json")
    manifest = json.loads(__loader__.get_data(where))  # type: ignore[name-defined]
    return manifest["schema"]  # type: ignore[no-any-return]


def check_input(tool: str, schema: Mapping[str, Any], request: dict[str, Any]) -> None:
    """EINVAL (exit 2) naming every key of ``request`` that ``schema`` refuses: a required key
    that is missing, a key it does not declare (where ``additionalProperties`` is false), a
    value whose JSON type is not the one its property declares.

    Only those keywords, of the top-level object, are read here: a core tool's manifest
    states its inputs with them (``tests/tools/test_core_tool_input.py`` keeps it so), and the
    finer rules of a value (an enum, a bound, the settings inside ``tsh.config``'s ``set``)
    are the tool's own checks, with its own sentences.  jsonschema is not imported: it would
    cost every call of a core tool more than the tool's work."""
    # A schema of another tool (an MCP server's, projected) may spell these otherwise: a
    # property's schema as a boolean, draft 3's "required": true in a property, a type of its
    # own ("any"); what is not the common form is left to the full check of native mode.
    declared = schema.get("properties", {})
    declared = declared if isinstance(declared, dict) else {}
    required = schema.get("required", ())
    required = required if isinstance(required, list) else ()
    problems = [f"{key!r} is required" for key in required if key not in request]
    unknown = [key for key in request if key not in declared]
    if unknown and schema.get("additionalProperties", True) is False:
        names = ", ".join(repr(key) for key in unknown)
        verb = "is not an input" if len(unknown) == 1 else "are not inputs"
        inputs = ", ".join(repr(key) for key in declared)
        takes = f"its inputs: {inputs}" if inputs else "it takes none"
        problems.append(f"{names} {verb} of {tool} ({takes})")
    for key, value in request.items():
        property_schema = declared.get(key)
        expected = property_schema.get("type") if isinstance(property_schema, dict) else None
        if _known_types(expected) and not _is_json_type(value, expected):
            problems.append(f"{key!r} must be of type {expected}")
    if problems:
        raise ToolFailure(errno_names.EINVAL, "; ".join(problems), usage=True)


_JSON_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "number": lambda value: isinstance(value, int | float) and not isinstance(value, bool),
    # JSON Schema's integer: any number with no fractional part (1.0 is one)
    "integer": lambda value: (
        (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and value.is_integer())
    ),
}


def _known_types(expected: object) -> bool:
    """Whether ``expected`` names JSON types only (a name, or a list of names)."""
    names = [expected] if isinstance(expected, str) else expected
    return (
        isinstance(names, list)
        and bool(names)
        and all(isinstance(name, str) and name in _JSON_TYPES for name in names)
    )


def _is_json_type(value: object, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    return any(_JSON_TYPES[name](value) for name in names)


def require(request: Mapping[str, Any], key: str, kind: type, default: Any = REQUIRED) -> Any:
    """``request[key]`` when it has the right type (or the default when absent); else EINVAL."""
    if key not in request:
        if default is REQUIRED:
            raise ToolFailure(errno_names.EINVAL, f"{key!r} is required", usage=True)
        return default
    value = request[key]
    if kind is int and isinstance(value, float) and value.is_integer():
        # 1.0 is an integer as JSON Schema counts (the schema let it through): taken as 1.
        return int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        named = _JSON_NAMES.get(kind, kind.__name__)
        raise ToolFailure(errno_names.EINVAL, f"{key!r} must be of type {named}", usage=True)
    return value


# The JSON type each Python type :func:`require` checks stands for, as check_input names it:
# the input is JSON, and Python's names (str, dict) mean nothing to whoever wrote it.
_JSON_NAMES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _parse_object(text: str) -> dict[str, Any]:
    # A byte order mark before the JSON is ignored, as ctx run --native ignores it.
    text = text.removeprefix("\ufeff")
    try:
        # Strict, as ctx run reads it: a name given twice would have the tool act on the
        # value a reviewer of its logged input did not see first (agent.create's label, say).
        request = jsontext.loads_strict(text)
    except jsontext.DuplicateNames as exc:
        problem = jsontext.duplicate_names_problem(exc.names)
        raise ToolFailure(errno_names.EINVAL, f"the input {problem}", usage=True) from None
    except ValueError as exc:
        raise ToolFailure(errno_names.EINVAL, f"input is not JSON: {exc}", usage=True) from None
    if not isinstance(request, dict):
        raise ToolFailure(errno_names.EINVAL, "input must be a JSON object", usage=True)
    return request


def _fail(tool: str, failure: ToolFailure, native: bool, program: str | None) -> int:
    name = errno_names.errorcode.get(failure.errno, f"E{failure.errno}")
    _say(tool, name, failure.message, program)
    if native:
        report = {"error": name, "errno": failure.errno, "message": failure.message}
        lost = _write_output(tool, (json.dumps(report) + "\n").encode(), program)
        if lost is not None:
            return lost
    return 2 if failure.usage else 1


def _say(tool: str, name: str, message: str, program: str | None) -> None:
    """``<tool>: <ERRNO>: <sentence>`` on stderr (``<program>: <ERRNO>: <tool>: …`` for a tool
    run inside ``program``).  One line, shown escaped: a message may quote what others wrote
    (an MCP server's error text, a file name), which must not reach the caller's terminal as
    escape sequences."""
    if program:
        sys.stderr.write(f"{program}: {name}: {tool}: {printable(message)}\n")
    else:
        sys.stderr.write(f"{tool}: {name}: {printable(message)}\n")
