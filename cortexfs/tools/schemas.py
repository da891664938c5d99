"""JSON Schema checks shared by manifests, tool controls and the runner (SPEC T-1, T-8, C-2).

Two questions: *is this a JSON Schema?* (a tool's ``schema`` and ``program`` controls must be)
and *does this input satisfy it?* (before every native call).  Both are answered by
:mod:`cortexfs.tools.schema_subset` when the schema keeps to the common keywords, so that a
call does not import jsonschema; otherwise by jsonschema, whose validators are compiled once
per distinct schema and kept, because a worker validates thousands of calls against a handful
of schemas.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cortexfs import jsontext
from cortexfs.errors import invalid
from cortexfs.forks import ProcessLock
from cortexfs.tools import ecma_regex, schema_patterns, schema_subset
from cortexfs.tools.schema_references import DATA_KEYWORDS, reference_problems

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

_CACHED_VALIDATORS = 256


def schema_problems(schema: object, what: str) -> list[str]:
    """Why ``schema`` is not a usable JSON Schema object; empty when it is one."""
    if not isinstance(schema, dict):
        return [f"{what} must be a JSON Schema object, not {jsontext.what_it_is(schema)}"]
    character = jsontext.lone_surrogate(schema)
    if character is not None:
        # JSON can spell one ("\\ud800"), but no UTF-8 control can hold it.
        return [f"{what} holds {character!r}, a lone surrogate, which is no character"]
    if schema_subset.well_formed(schema):
        return []  # the common keywords only: no reference to resolve
    declared = schema.get("$schema", "")
    if not isinstance(declared, str):
        # Which draft applies is read from it: anything but a URI names none.
        return [
            f"{what} is not a valid JSON Schema: $schema must be a string naming a draft's "
            f"meta-schema (a URI), not {jsontext.what_it_is(declared)}"
        ]
    text = _canonical(schema)
    problems = [f"{what} is not a valid JSON Schema: {problem}" for problem in _meta_problems(text)]
    problems += reference_problems(schema, what)
    if problems:
        return problems
    endless = _endless(text)
    return [f"{what} cannot be applied: {endless}"] if endless else []


@functools.lru_cache(maxsize=_CACHED_VALIDATORS)
def _meta_problems(schema_text: str) -> tuple[str, ...]:
    """Checking a schema against its meta-schema costs milliseconds; each text is checked once."""
    import jsonschema  # here, not above: about 100 ms that a plain input check does not need

    schema = json.loads(schema_text)
    validator_class = jsonschema.validators.validator_for(schema)
    # With the formats the meta-schema names checked: a "pattern" must be a regex that
    # compiles (as ECMA-262 reads it), which validating an input would find only by failing.
    format_checker = copy.deepcopy(validator_class.FORMAT_CHECKER)
    format_checker.checks("regex", raises=re.error)(ecma_regex.compiled)
    meta_validator = validator_class(validator_class.META_SCHEMA, format_checker=format_checker)
    return tuple(
        f"{_where(tuple(error.absolute_path))}{brief_message(error)}"
        for error in meta_validator.iter_errors(schema)
    )


class UnusableSchema(Exception):
    """A schema that passed its checks but cannot be applied to an input: a reference that
    leads back to itself without consuming anything (``{"$ref": "#"}`` under a keyword the
    probe of :func:`_endless` did not reach)."""


# What a schema is tried on before it counts as applicable: the probe finds a schema that
# refers to itself at the top, whatever the input; deeper cycles are met at a call.
_PROBES = (None, {}, [], "")


@functools.lru_cache(maxsize=_CACHED_VALIDATORS)
def _endless(schema_text: str) -> str | None:
    """Why a schema valid against its meta-schema still cannot be applied; None when the
    probes pass through it."""
    for probe in _PROBES:
        try:
            for _ in _validator(schema_text).iter_errors(probe):
                pass
        except RecursionError:
            return "it refers to itself without end (a $ref cycle that consumes nothing)"
    return None


def instance_problems(
    schema: Mapping[str, Any], instance: object, *, within: float | None = None
) -> list[str]:
    """Every reason ``instance`` fails ``schema``, in document order; empty when it passes.
    :class:`UnusableSchema` when the schema cannot be applied to it.  ``within``: the
    seconds the check may take, when a pattern of the schema may backtrack for ever
    (:mod:`cortexfs.tools.schema_patterns`: then judged in a child process, ETIMEDOUT past
    them); None judges here, however long it takes."""
    if within is not None and schema_patterns.may_backtrack(schema):
        verdict = schema_patterns.judged_within(schema, instance, within)
        if "unusable" in verdict:
            raise UnusableSchema(verdict["unusable"])
        return list(verdict["problems"])
    common = schema_subset.problems(schema, instance)
    if common is not None:
        return [f"{_where(path)}{message}" for path, message in common]
    from referencing.exceptions import Unresolvable

    try:
        with _headroom.held():
            errors = list(_validator(_canonical(schema)).iter_errors(instance))
    except RecursionError:
        raise UnusableSchema(
            "it refers to itself without end (a $ref cycle that consumes nothing), or leads "
            f"jsonschema deeper than {_RECURSION_FOR_JSONSCHEMA} frames"
        ) from None
    except Unresolvable as exc:  # a schema installed before its references were checked
        raise UnusableSchema(f"a reference of it does not resolve: {exc}") from None
    return [
        f"{_where(tuple(error.absolute_path))}{brief_message(error)}"
        for error in sorted(errors, key=_document_order)
    ]


class _RecursionHeadroom:
    """The interpreter's recursion limit raised to ``limit`` while any thread needs it, and
    the caller's own limit back after the last one (a library caller's limit is its own).
    A child forked meanwhile has none of the threads that held it: its caller's limit is
    back, and nobody holds it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = ProcessLock()
        self._holders = 0
        self._callers_limit = 0
        os.register_at_fork(after_in_child=self._held_by_nobody)

    def _held_by_nobody(self) -> None:
        if self._holders:
            self._holders = 0
            sys.setrecursionlimit(self._callers_limit)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._callers_limit = sys.getrecursionlimit()
                sys.setrecursionlimit(max(self.limit, self._callers_limit))
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    sys.setrecursionlimit(self._callers_limit)


# jsonschema descends some 25 frames for each level of an input met through references
# (allOf, anyOf, $ref): an input as deep as any reader takes (jsontext.MAX_DEPTH, 128) needs
# some 3 200, past Python's default limit of 1 000, and a schema that passed its checks
# would be called a cycle for it.  Well within an 8 MiB thread stack.
_RECURSION_FOR_JSONSCHEMA = 6000
_headroom = _RecursionHeadroom(_RECURSION_FOR_JSONSCHEMA)


def brief_message(error: ValidationError) -> str:
    """jsonschema's message, with the values it quotes (the input's, and the keyword's: an
    enum's choices) cut short as the common checks cut them: a description of 200 KB, or an
    enum of 30 000 names, would otherwise be repeated whole in the refusal.  A pattern is
    quoted as the schema holds it, not as :func:`_validator` gave it to jsonschema."""
    message = error.message
    for quoted in (error.instance, error.validator_value):
        message = message.replace(repr(quoted), schema_subset.show(quoted), 1)
    holder = error.schema if isinstance(error.schema, dict) else {}
    patterns = [holder.get("pattern"), *holder.get("patternProperties", ())]
    for python in filter(None, patterns):
        message = message.replace(repr(python), repr(ecma_regex.written(python)))
    return message


def validate_input(
    schema: Mapping[str, Any], instance: object, tool: str, *, within: float | None = None
) -> None:
    """EINVAL naming the first violation when ``instance`` is not a valid input of ``tool``;
    ``within`` as for :func:`instance_problems`."""
    problems = instance_problems(schema, instance, within=within)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise invalid(f"input does not match the schema of {tool}: {problems[0]}{more}")


@functools.lru_cache(maxsize=_CACHED_VALIDATORS)
def _validator(schema_text: str) -> Validator:
    import jsonschema

    schema = json.loads(schema_text)
    validator_class = jsonschema.validators.validator_for(schema)
    return validator_class(_with_python_patterns(schema))  # type: ignore[no-any-return]


def _with_python_patterns(schema: Any) -> Any:
    """``schema`` with each ``pattern`` and ``patternProperties`` name rewritten into the
    Python pattern of its ECMA-262 meaning (:mod:`cortexfs.tools.ecma_regex`), which
    jsonschema's ``re.search`` then runs; data (an ``enum``, a ``const``…) is left alone."""
    if isinstance(schema, list):
        return [_with_python_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rewritten: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in DATA_KEYWORDS:
            rewritten[keyword] = value
        elif keyword == "pattern" and isinstance(value, str):
            rewritten[keyword] = ecma_regex.python_pattern(value)
        elif keyword == "patternProperties" and isinstance(value, dict):
            rewritten[keyword] = {
                ecma_regex.python_pattern(name): _with_python_patterns(subschema)
                for name, subschema in value.items()
            }
        else:
            rewritten[keyword] = _with_python_patterns(value)
    return rewritten


def _canonical(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def _where(where: schema_subset.Path) -> str:
    path = "/".join(str(part) for part in where)
    return f"at /{path}: " if path else ""


def _document_order(error: ValidationError) -> list[str]:
    return [str(part) for part in error.absolute_path]
