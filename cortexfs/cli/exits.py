"""Exit statuses of every ``ctx`` command (SPEC §2.4), and the error that selects status 2."""

from __future__ import annotations

from cortexfs.errors import CtxError

EXIT_OK = 0
EXIT_REFUSED = 1  # an operation or request was refused, or a conflict was found
EXIT_USAGE = 2  # a malformed command line
EXIT_NOTHING = 3  # nothing to do


class UsageProblem(CtxError):
    """A malformed command line (a bad name, a bad number): exit status 2, not 1."""


def usage_problem(error: CtxError) -> UsageProblem:
    return UsageProblem(error.errno, error.message)


def exit_status(error: CtxError) -> int:
    return EXIT_USAGE if isinstance(error, UsageProblem) else EXIT_REFUSED
