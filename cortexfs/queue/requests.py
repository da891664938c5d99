"""Request and result documents (SPEC §2.1).

A request is one JSON object, UTF-8: ``{"tool": "<tool name>", "input": {...}, "from":
"<agent or user>", "created": "<RFC 3339>"}`` plus any extra fields the publisher adds.  A
result is ``{"status": "ok"|"error", "output": ..., "worker": {...}, "started": ...,
"finished": ...}``.
"""

from __future__ import annotations

import codecs
import errno
import functools
import getpass
import json
import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, NamedTuple

from cortexfs import jsontext
from cortexfs.errors import CtxError, invalid, too_big
from cortexfs.names import object_name_problem
from cortexfs.timefmt import parse_rfc3339, rfc3339

_CHUNK = 1 << 16  # how much of a request or result source is read at a time


def default_publisher() -> str:
    """Who publishes when nobody says: the agent this process runs as, else the user."""
    agent = os.environ.get("CTX_AGENT")
    if agent:
        return agent
    return _login_name(os.getuid(), tuple(map(os.environ.get, _LOGIN_VARIABLES)))


# What getpass.getuser() consults before the password database, in its order.
_LOGIN_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")


@functools.lru_cache(maxsize=16)
def _login_name(uid: int, login_variables: tuple[str | None, ...]) -> str:
    """getpass.getuser() for this uid and these login variables.  Remembered: without the
    variables it reads the whole password database, and a worker publishes thousands of
    jobs."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.geteuid()}"


def request_problems(request: object) -> list[str]:
    """Every reason ``request`` is not a valid request (empty when it is)."""
    if not isinstance(request, Mapping):
        return [f"a request must be one JSON object, not {jsontext.what_it_is(request)}"]
    problems = []
    tool = request.get("tool")
    if not isinstance(tool, str):
        problems.append("field 'tool' must be a string naming the tool to run")
    else:
        problem = object_name_problem(tool)
        if problem:
            problems.append(f"field 'tool': {problem}")
    if not isinstance(request.get("input"), Mapping):
        problems.append("field 'input' must be a JSON object (use {} for no input)")
    if "from" in request and not isinstance(request["from"], str):
        problems.append("field 'from' must be a string")
    if "created" in request:
        problems += _created_problems(request["created"])
    return problems


def _created_problems(created: object) -> list[str]:
    """Why a given ``created`` is no RFC 3339 timestamp (empty when it is one)."""
    if not isinstance(created, str):
        what = jsontext.what_it_is(created)
        return [f"field 'created' must be a string (an RFC 3339 timestamp), not {what}"]
    try:
        parse_rfc3339(created)
    except CtxError as exc:
        return [f"field 'created': {exc.message}"]
    if created != created.strip():
        # Kept as written: a stamp stored with a blank or a line break around it is no
        # RFC 3339 timestamp to whoever reads it back.
        return [f"field 'created': {created!r} has blanks around the RFC 3339 timestamp"]
    return []


def complete_request(request: Mapping[str, Any], publisher: str | None = None) -> dict[str, Any]:
    """Validate and fill in ``from`` and ``created`` when the publisher left them out."""
    if publisher is not None and not isinstance(publisher, str):
        raise TypeError(f"publisher must be a str naming who publishes, not {type(publisher)}")
    problems = request_problems(request)
    if problems:
        raise invalid("invalid request: " + "; ".join(problems))
    completed = dict(request)
    completed.setdefault("from", publisher or default_publisher())
    completed.setdefault("created", rfc3339())
    return completed


# What storing adds to a request the publisher gave: "from" and "created" when absent.  A
# stored request may be this much larger than the limit the publisher's bytes were held to;
# readers of stored requests allow for it (stored_request_limit).
STORED_OVERHEAD = 64 * 1024

_JSON_WHITESPACE = b" \t\n\r"


def stored_request_limit(limit: int) -> int:
    """The size a stored request may reach when the request given was at most ``limit``."""
    return limit + STORED_OVERHEAD


def stored_result_limit(limit: int) -> int:
    """The size a stored result may reach under ``max_result_bytes`` = ``limit``: a failure
    record (why a job failed, written by a worker or by recover) may exceed a tiny limit."""
    return max(limit, 1 << 20)


def encode_request(
    request: Mapping[str, Any],
    limit: int,
    publisher: str | None = None,
    given: bytes | None = None,
) -> bytes:
    """The bytes to store for a complete, valid request; EFBIG when the request given is over
    ``limit``.

    The limit applies to what the publisher gave (SPEC §2.1: larger requests are refused):
    ``given``, the bytes of the file or line ``request`` was parsed from, else ``request`` as
    compact JSON.  Given bytes are stored as they are, with only the ``from`` and ``created``
    the publisher left out put in front: re-encoding could make them larger (separators,
    escapes, number spellings) and refuse a request that was within the limit.
    """
    given_size = len(_compact_json(request) if given is None else given)
    if given_size > limit:
        raise too_big(_over_limit("request", given_size, limit, "max_request_bytes"))
    completed = complete_request(request, publisher)
    if given is None:
        data = _compact_json(completed) + b"\n"
    else:
        added = {key: completed[key] for key in ("from", "created") if key not in request}
        data = _with_fields_first(given.strip(_JSON_WHITESPACE), added) + b"\n"
    if len(data) > stored_request_limit(limit):  # only a 'from' of more than 64 KiB gets here
        raise too_big(
            f"request is {len(data)} bytes once stored ('from' and 'created' added); this "
            f"queue stores at most {stored_request_limit(limit)}"
        )
    return data


def _compact_json(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8; a lone surrogate (which UTF-8 cannot hold) is kept
    as the ``\\uXXXX`` escape it came as, by escaping every non-ASCII character.  EINVAL for
    what a claimer could not read back (:func:`jsontext.dumps_document`): NaN and the
    infinities, integers of too many digits, a value that holds itself, nesting too deep."""
    try:
        return jsontext.dumps_document(value, separators=(",", ":"))
    except jsontext.Unwritable as exc:
        raise invalid(f"request is not JSON: it {exc}") from None


def _with_fields_first(document: bytes, fields: Mapping[str, Any]) -> bytes:
    """The JSON object ``document`` (stripped, already parsed as an object) with ``fields``
    inserted as its first members, the rest byte for byte as given."""
    if not fields:
        return document
    members = b",".join(
        _compact_json(key) + b":" + _compact_json(value) for key, value in fields.items()
    )
    rest = document[1:]  # after the opening brace
    empty = rest.lstrip(_JSON_WHITESPACE).startswith(b"}")
    return b"{" + members + (b"" if empty else b",") + rest


def not_a_json_number(where: str, spelling: object) -> CtxError:
    """EINVAL for ``where`` (``request``, ``the result file``), which holds ``spelling`` for a
    number."""
    return invalid(f"{where} is not JSON: it {jsontext.not_a_json_number_problem(spelling)}")


def loads_json(text: str) -> Any:
    """``json.loads``, refusing what only Python's reader takes for numbers (NaN, Infinity,
    -Infinity) with :class:`~cortexfs.jsontext.NotAJsonNumber`: stored as such, a request or
    result would be no JSON document any other reader accepts (§2.1)."""
    return jsontext.loads_strict(text, unique_names=False)


def parse_request_bytes(data: bytes, limit: int, where: str = "request") -> dict[str, Any]:
    """Parse a request given as raw bytes (a file or stdin): one JSON object, UTF-8.

    A name given twice in one object is refused: the bytes are stored as given, and another
    reader (a worker in another language, jq) may take the first of the two where we validated
    the last — a request that names one tool here and another there."""
    if len(data) > limit:
        raise too_big(_over_limit(where, len(data), limit, "max_request_bytes"))
    if data.startswith(codecs.BOM_UTF8):
        # RFC 8259 lets a reader refuse it, and a request is stored as given: a reader that
        # does not skip it would find no JSON at all.
        raise invalid(
            f"{where} starts with a byte order mark (U+FEFF), which is no part of JSON; save "
            "it as UTF-8 without one"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"{where} is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        value = jsontext.loads_strict(text)
    except jsontext.NotAJsonNumber as exc:
        raise not_a_json_number(where, exc) from None
    except jsontext.DuplicateNames as exc:
        raise invalid(f"{where} {jsontext.duplicate_names_problem(exc.names)}") from None
    except json.JSONDecodeError as exc:
        raise invalid(
            # Python's message for a control character ends in "at" already.
            f"{where} is not JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno} column "
            f"{exc.colno}"
        ) from exc
    if not isinstance(value, dict):
        raise invalid(f"{where} must be one JSON object, not {jsontext.what_it_is(value)}")
    return value


def read_at_most(stream: BinaryIO, limit: int, what: str, setting: str) -> bytes:
    """Everything ``stream`` holds when that is at most ``limit`` bytes; EFBIG otherwise.

    Never reads more than ``limit + 1`` bytes: a source that does not end (``/dev/zero``, a
    runaway pipe) is refused once it passed the limit instead of filling memory.  ``what``
    names the source in the message, ``setting`` the ``queue/config`` key of the limit.
    """
    chunks, size = [], 0
    while size <= limit:
        chunk = stream.read(min(limit + 1 - size, _CHUNK))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise too_big(_over_limit(what, _size_of(stream, limit), limit, setting))


def _over_limit(what: str, size: int | str, limit: int, setting: str) -> str:
    """Why ``what``, ``size`` bytes long, is refused: more than the ``setting`` of this queue's
    ``queue/config`` allows."""
    return f"{what} is {size} bytes; this queue accepts at most {limit} ({setting} in queue/config)"


def _size_of(stream: BinaryIO, limit: int) -> str:
    """The size of an oversize source: exact for a regular file, else 'more than LIMIT'."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > limit:
        return str(st.st_size)
    return f"more than {limit}"


class Batch(NamedTuple):
    """The requests of a JSON Lines batch, the line each came from (its bytes, without the
    line end) and that line's number in the input (1-based, as errors name it)."""

    requests: list[dict[str, Any]]
    lines: list[bytes]
    numbers: list[int]


MAX_BAD_LINES_SAID = 20  # of a batch refused, before the reading of it ends


def parse_batch(stream: BinaryIO, limit: int) -> Batch:
    """The requests of a JSON Lines batch, with their lines and line numbers.

    Every line is held to ``limit`` (max_request_bytes); blank lines are skipped; lines are
    numbered as ``bytes.splitlines`` splits them.  EINVAL naming the bad lines, and nothing
    returned, when one is bad: every one up to :data:`MAX_BAD_LINES_SAID`, after which the
    reading ends (a binary file, ``/dev/urandom``, would otherwise make a message as large as
    itself, or never end).  A line that grows past the limit ends the reading too: the rest
    of the source is never read or held, whatever its size.
    """
    batch = Batch([], [], [])
    problems = []
    for lineno, line in _lines_within(stream, limit):
        if line is None:
            problems.append(
                _over_limit(f"line {lineno}", f"more than {limit}", limit, "max_request_bytes")
            )
            break
        if not line.strip():
            continue
        if len(problems) == MAX_BAD_LINES_SAID:
            problems.append(f"and more from line {lineno} on, not read")
            break
        try:
            request = parse_request_bytes(line, limit, f"line {lineno}")
        except CtxError as exc:
            problems.append(exc.message)
            continue
        # Its fields too, as publishing would judge them: the refusal names every bad line,
        # not the lines that are no JSON while others that are hold a bad field.
        wrong = request_problems(request)
        if wrong:
            problems.append(f"line {lineno}: invalid request: " + "; ".join(wrong))
            continue
        batch.requests.append(request)
        batch.lines.append(line)
        batch.numbers.append(lineno)
    if problems:
        raise invalid("batch refused, nothing published: " + "; ".join(problems))
    if not batch.requests:
        raise invalid("the batch holds no requests")
    return batch


def _lines_within(stream: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """(number, line) for each line of ``stream``, split at \\n, \\r\\n or \\r as
    ``bytes.splitlines`` splits; the line is None, and the last, for one that grew past
    ``limit`` before its end was read."""
    partial = bytearray()
    number = 0
    while chunk := stream.read(_CHUNK):
        for piece in chunk.splitlines(keepends=True):
            if partial.endswith(b"\r"):  # ended, unless this piece makes it '\r\n'
                if piece == b"\n":
                    partial += piece
                    piece = b""
                number += 1
                yield number, _without_line_end(bytes(partial))
                partial.clear()
            partial += piece
            if partial.endswith(b"\n"):
                number += 1
                yield number, _without_line_end(bytes(partial))
                partial.clear()
            elif len(partial) - partial.endswith(b"\r") > limit:
                yield number + 1, None
                return
    if partial:
        yield number + 1, _without_line_end(bytes(partial))


def _without_line_end(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return line[:-2]
    return line[:-1] if line.endswith((b"\n", b"\r")) else line


def decode_stored_request(data: bytes) -> dict[str, Any]:
    """A request read back from the queue; EINVAL when someone put a malformed file there."""
    value = parse_request_bytes(data, len(data), "stored request")
    problems = request_problems(value)
    if problems:
        raise invalid("stored request is malformed: " + "; ".join(problems))
    return value


class ResultOverLimit(CtxError):
    """EFBIG: a result larger than the queue's ``max_result_bytes``.  Its own class, for the
    kernel says EFBIG too, when a write passes the host's file-size limit (``ulimit -f``):
    the first is the result's doing, the second the host's."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EFBIG, message)


# A result wraps an output, which may be as deep as any document a reader takes: one level
# deeper, as every reader of a result takes it (show, recover, a finish completed again).
RESULT_MAX_DEPTH = jsontext.MAX_DEPTH + 1


def decode_result(data: bytes | str, *, unique_names: bool = True) -> Any:
    """A result read back from the queue, as :func:`encode_result` writes one."""
    return jsontext.loads_strict(data, unique_names=unique_names, max_depth=RESULT_MAX_DEPTH)


def encode_result(result: Mapping[str, Any], limit: int | None) -> bytes:
    """The bytes of a result; :class:`ResultOverLimit` above ``limit`` (None: no limit);
    EINVAL for one no reader would take back (an output nested deeper than a document may
    be, NaN…)."""
    try:
        data = jsontext.dumps_document(result, default=str, max_depth=RESULT_MAX_DEPTH) + b"\n"
    except jsontext.Unwritable as exc:
        raise invalid(f"the result is not JSON: it {exc}") from None
    if limit is not None and len(data) > limit:
        raise ResultOverLimit(_over_limit("result", len(data), limit, "max_result_bytes"))
    return data
