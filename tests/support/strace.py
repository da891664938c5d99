"""The log of ``strace -f -o LOG``, one whole system call a line.

When another traced process or thread makes a call while one is still in progress, strace
prints the first call in two pieces: ``PID write(4, "…", 213 <unfinished ...>`` and, later,
``PID <... write resumed>) = 213``.  A test that reads each line as one call would then see a
call without its result, or a result without its call, depending on how the scheduler happened
to interleave the processes.  :func:`trace_lines` puts every such call back on one line, at
the place where it started.

:func:`first_process_steps` and :func:`pick` name one call of a traced command, so that a test
can run the command again with a fault or a signal injected right there (:func:`can_inject`).
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"^(?P<pid>\d+)\s+<\.\.\. (?P<call>\w+) resumed>\s?(?P<rest>.*)$")
_PID = re.compile(r"^(?P<pid>\d+)\s")


def rejoined(lines: list[str]) -> list[str]:
    """``lines`` of an strace log with each call split by another process made whole again."""
    joined: list[str] = []
    started: dict[str, int] = {}  # pid -> index in ``joined`` of its unfinished call
    for line in lines:
        resumed = _RESUMED.match(line)
        if resumed and resumed["pid"] in started:
            joined[started.pop(resumed["pid"])] += resumed["rest"]
            continue
        joined.append(line.removesuffix(_UNFINISHED))
        pid = _PID.match(line)
        if line.endswith(_UNFINISHED) and pid:
            started[pid["pid"]] = len(joined) - 1
    return joined


def trace_lines(log: Path) -> list[str]:
    """The calls that ``strace -f -o LOG`` wrote to ``log``, one whole call a line."""
    return rejoined(log.read_text().splitlines())


# One system call of ``strace -o LOG``: the pid, the call's name and the rest of the line.
CALL_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
# What differs between two runs of one command: job names and the random tokens of temp names.
TOKEN = re.compile(r"job-\d{8}T\d{6}-[0-9a-f]+|[0-9a-f]{10,}")


def can_inject(*options: str) -> bool:
    """Whether this host's strace injects faults (``-e inject=``) with ``options``: a build
    or a kernel without it (no ptrace in a container, an old strace) cannot."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(
        ["strace", "-f", "-qq", *options, "-o", "/dev/null", "-e",
         "inject=getpid:error=EIO:when=99", "true"],
        capture_output=True,
    )  # fmt: skip
    return probe.returncode == 0


@dataclass(frozen=True)
class Step:
    """The ``nth`` call of ``call`` made by the command's own process (strace counts each
    call of each process on its own), as strace printed it."""

    call: str
    nth: int
    text: str

    def __str__(self) -> str:
        return f"{self.call}#{self.nth}: {self.text[:140]}"

    @property
    def signature(self) -> str:
        """What identifies the call from one run to the next: its arguments without the
        random tokens of temp names (for a ``write``, only the descriptor)."""
        head = re.split(r"\s+=\s", self.text, maxsplit=1)[0].removesuffix(_UNFINISHED)
        head = head.rstrip().removesuffix(")")
        if self.call == "write":
            head = head.split(",")[0]
        return TOKEN.sub("~", head)


def first_process_steps(trace: Path) -> list[Step]:
    """The calls of the first process in ``trace`` (the traced command), in order."""
    seen: collections.Counter[str] = collections.Counter()
    steps: list[Step] = []
    main = None
    for line in trace_lines(trace):
        match = CALL_LINE.match(line)
        if not match:
            continue
        pid, call, rest = match.groups()
        main = main or pid
        if pid == main:
            seen[call] += 1
            steps.append(Step(call, seen[call], f"{call}({rest}"))
    return steps


def pick(steps: list[Step], call: str, contains: str = "", after: Step | None = None,
         skip: int = 0) -> Step:  # fmt: skip
    """The ``skip``-th call ``call`` whose text holds ``contains``, after ``after``."""
    start = steps.index(after) + 1 if after is not None else 0
    found = [s for s in steps[start:] if s.call == call and contains in s.text]
    assert len(found) > skip, (call, contains, str(after), [str(s) for s in steps])
    return found[skip]
