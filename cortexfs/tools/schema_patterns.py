"""Schemas whose patterns may backtrack for ever (SPEC T-1; docs/tools.md, *How an input is
checked*).

Python's regular expressions backtrack: a repeat inside a repeat (``^(a+)+$``,
``^(\\w+\\s?)*$``) can take time exponential in the length of an input that almost matches,
and the match holds the interpreter's lock all the while — in a worker, the threads that renew
its leases too, so that its jobs' leases lapse and recover hands them to the next worker, which
hangs in turn.  Such a pattern is known by its form (:func:`may_backtrack`), and an input is
checked against a schema holding one in a child process given the call's time
(:func:`judged_within`): a call whose input the pattern cannot judge in that time is refused,
ETIMEDOUT, and nothing else waits for it.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cortexfs.errors import CtxError
from cortexfs.tools import ecma_regex
from cortexfs.tools.schema_references import schema_nodes

_CACHED = 256


def may_backtrack(schema: Any) -> bool:
    """Whether a ``pattern`` (or a ``patternProperties`` name) of ``schema`` is of a form
    that may backtrack for ever (:func:`_nested_repeat`).  Each pattern is parsed once."""
    return any(_nested_repeat(pattern) for pattern in _patterns(schema))


def _patterns(schema: Any) -> Iterator[str]:
    for node, _ in schema_nodes(schema):
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            yield from node["patternProperties"]


@functools.lru_cache(maxsize=_CACHED)
def _nested_repeat(pattern: str) -> bool:
    """Whether ``pattern`` holds, inside a repeat that can go round more than once, a repeat
    that can too (one of the two unbounded), or, inside an unbounded one, an alternation or
    an optional part (``^(a|a?)+$``): each gives the repeat more than one way through the
    same text.  A possessive repeat or an atomic group gives nothing back, so what is inside
    it counts for nothing."""
    # The parser re itself compiles with, so that what is judged is what re will run.
    from re import _constants as sre
    from re import _parser

    try:
        parsed = _parser.parse(ecma_regex.python_pattern(pattern))
    except (re.error, RecursionError, OverflowError):
        return False  # not a pattern re compiles: the schema's own check refuses it
    pending: list[tuple[Any, bool | None]] = [(parsed, None)]  # (items, the enclosing repeat)
    while pending:
        items, enclosing_unbounded = pending.pop()
        for op, argument in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
                least, most, body = argument
                if most > 1 and least != most:  # a fixed count ({3}) has one way to match
                    unbounded = most == sre.MAXREPEAT
                    if enclosing_unbounded is not None and (unbounded or enclosing_unbounded):
                        return True
                    pending.append((body, unbounded or bool(enclosing_unbounded)))
                elif least == 0 and enclosing_unbounded:
                    return True  # an optional part of a repeated one
                else:
                    pending.append((body, enclosing_unbounded))
            elif op == sre.SUBPATTERN:
                pending.append((argument[-1], enclosing_unbounded))
            elif op == sre.BRANCH:
                if enclosing_unbounded:
                    return True  # an alternation in an unbounded repeat
                pending.extend((branch, enclosing_unbounded) for branch in argument[1])
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                pending.append((argument[1], enclosing_unbounded))
            elif op == sre.GROUPREF_EXISTS:
                pending.extend((branch, enclosing_unbounded) for branch in argument[1:] if branch)
    return False


def judged_within(schema: Any, instance: object, seconds: float) -> dict[str, Any]:
    """What :func:`cortexfs.tools.schemas.instance_problems` finds of ``instance`` against
    ``schema``, in a child process given ``seconds``: ``{"problems":
    [...]}``, or ``{"unusable": why}``; ETIMEDOUT when the child could not judge in that
    time (it is killed), EIO when it failed."""
    package_root = str(Path(__file__).resolve().parents[2])
    environment = {**os.environ, "PYTHONPATH": package_root}
    document = json.dumps({"schema": schema, "instance": instance})
    try:
        child = subprocess.run(
            [sys.executable, "-E", "-s", "-m", "cortexfs.tools.schema_patterns", str(os.getpid())],
            input=document.encode(),
            capture_output=True,
            timeout=seconds,
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CtxError(
            errno.ETIMEDOUT,
            f"the input was not judged within {seconds:g} s: a pattern of the schema repeats "
            "a repeat, and may take longer than any call on an input that almost matches it; "
            "the tool's installer keeps patterns free of nested unbounded repeats",
        ) from None
    if child.returncode != 0:
        said = child.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no word"]
        raise CtxError(errno.EIO, f"the input could not be judged: {said[0]}")
    return json.loads(child.stdout)  # type: ignore[no-any-return]


def _judge_from_stdin() -> None:
    """The child of :func:`judged_within`: the schema and instance on stdin, the verdict on
    stdout.  Its first step: dying with the process that started it (its pid is the only
    argument), which a SIGKILL gives no time to kill a judge that may spin for as long as
    a pattern's backtracking takes (I-4: nothing of a call outlives its caller)."""
    from cortexfs.tools import orphans
    from cortexfs.tools.schemas import UnusableSchema, instance_problems

    orphans.die_with_parent(int(sys.argv[1]))()
    given = json.load(sys.stdin.buffer)
    try:
        problems = instance_problems(given["schema"], given["instance"])
        verdict: dict[str, Any] = {"problems": problems}
    except UnusableSchema as unusable:
        verdict = {"unusable": str(unusable)}
    json.dump(verdict, sys.stdout)


if __name__ == "__main__":
    _judge_from_stdin()
