"""The ``ctx`` command line: a thin layer over the library (one module per command group).

``ctx run`` is the path of every tool call made from a shell, so it starts without click:
importing click costs about 35 ms, a third of what a trivial core tool takes to run.  It
parses its arguments with argparse (:mod:`cortexfs.cli.run`); every other command, and
``ctx --storage DIR run …``, goes through the click group of :mod:`cortexfs.cli.group`,
whose ``run`` hands its arguments to the same parser.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys
from collections.abc import Iterator


def main(args: list[str] | None = None, prog_name: str | None = None) -> None:
    # A command loads some 140 modules.  Left to the interpreter's teardown, the collector
    # would walk and free their objects one by one (about 10 ms, an eighth of a `ctx run`)
    # in a process about to end; frozen, they are left to the kernel.  Nothing waits on their
    # finalizers: streams are flushed before the teardown, and files are closed by their
    # owners.  An atexit hook, so a caller that runs main() in its own process and goes on
    # is not affected.
    atexit.register(gc.freeze)
    with _loading_for_good():
        from cortexfs.interrupts import (
            caused_by_interrupt,
            report_interrupts_later,
            reset_inherited_signal_state,
        )

    reset_inherited_signal_state()
    report_interrupts_later()
    argv = sys.argv[1:] if args is None else list(args)
    try:
        _main(argv, prog_name or "ctx")
    except MemoryError:
        from cortexfs.cli.exits import ran_out_of_memory

        queue_command = _command_of(argv) == "queue"
        ran_out_of_memory(prog_name or "ctx", "--json" in argv, queue_command=queue_command)
    except (KeyboardInterrupt, RuntimeError) as error:
        # Ctrl-C while modules load, outside what click reports itself: no traceback of the
        # import machinery, the same EINTR as a command interrupted later.
        if not caused_by_interrupt(error):
            raise
        from cortexfs.cli.exits import interrupted

        interrupted(prog_name or "ctx", "--json" in argv)


def _command_of(argv: list[str]) -> str:
    """The command word of ``argv`` (``queue`` in ``ctx --storage S queue status``)."""
    words = iter(argv)
    for word in words:
        if word == "--storage":
            next(words, None)  # its value
        elif not word.startswith("-"):
            return word
    return ""


def _main(argv: list[str], prog_name: str) -> None:
    from cortexfs.standard_streams import prepare_standard_streams

    prepare_standard_streams()
    if argv[:1] == ["run"]:
        with _loading_for_good():
            from cortexfs.cli.run import main as run_main

        sys.exit(run_main(argv[1:]))
    with _loading_for_good():
        from cortexfs.cli.group import main as group_main
        from cortexfs.cli.usage import run_click

    run_click(group_main, argv, prog_name)


@contextlib.contextmanager
def _loading_for_good() -> Iterator[None]:
    """Import modules whose objects live as long as the process, without the collector.

    Imports make objects by the thousand (some 13,000 for ``ctx run``), none of them garbage;
    the collector would walk them some twenty times while they load and again at each full
    collection after (about 4 ms of every ``ctx run``).  Frozen, it never looks at them.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
