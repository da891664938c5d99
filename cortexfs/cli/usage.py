"""Running a click command line so that a malformed one reads like every other refusal.

click reports a usage error as ``Error: Missing argument 'PERM'.`` and exits 2.  CortexFS says
why in errno terms everywhere (SPEC P-8: "a malformed query … is exit 2 with EINVAL"), so the
same error ends here as ``ctx: EINVAL: Missing argument 'PERM'.`` after click's usage lines,
still with exit status 2.  A command line that asked for ``--json`` also gets the error
object on standard output, as every other refusal of a ``--json`` command does.
"""

from __future__ import annotations

import errno
import json
import sys
from typing import NoReturn

import click

from cortexfs.cli.exits import (
    EXIT_OK,
    EXIT_USAGE,
    interrupted,
    output_failed,
    reader_gone,
)
from cortexfs.errors import CtxError
from cortexfs.printable import printable
from cortexfs.standard_streams import OutputError, discard_output, tell_output_errors

# click 8.2 raises this usage error, carrying the help text, for a group run without a command.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def run_click(
    command: click.Command, args: list[str], prog_name: str, obj: object = None
) -> NoReturn:
    """Run ``command`` on ``args`` and exit; ``obj`` is its context's object.

    Standard output is flushed here, before the exit, whatever ended the command: one it
    could not be written to ends as :func:`cortexfs.cli.exits.output_failed` says, not in a
    traceback or the interpreter's own complaint at its last flush (exit 120)."""
    tell_output_errors()
    try:
        _run(command, args, prog_name, obj)
    except OutputError as error:  # from a command without handles_errors (policy, --help)
        output_failed(error, prog_name)
    except SystemExit:
        if _hushed_by_click(sys.stdout):
            # click's own answer to a reader that left while it printed (--help, --version):
            # exit 1, where every command of ours ends quietly with 141.
            reader_gone()
        _flush_output(prog_name)
        raise


def _hushed_by_click(stream: object) -> bool:
    """Whether click wrapped ``stream`` to hush its last flush, as it does on EPIPE.  Asked by
    the wrapper's type name, ``PacifyFlushWrapper`` until click 8.5 made it private and
    deprecated importing the public name (a warning on every command in Python's dev mode, an
    error under ``-W error``); ``ctx run`` may put a stream of ours in its place, so ``is``
    would not tell it either."""
    kind = type(stream)
    return kind.__name__.lstrip("_") == "PacifyFlushWrapper" and kind.__module__.startswith("click")


def _run(command: click.Command, args: list[str], prog_name: str, obj: object) -> NoReturn:
    try:
        status = command.main(args=args, prog_name=prog_name, standalone_mode=False, obj=obj)
    except _NO_ARGS_IS_HELP as error:
        error.show()  # a bare group: its help, which is no error to explain
        sys.exit(EXIT_USAGE)
    except click.UsageError as error:
        context, asks_for_json = _read_line(command, args, prog_name)
        _show_usage_error(error, error.ctx or context, prog_name)
        if asks_for_json:
            _emit_usage_error(CtxError(errno.EINVAL, error.format_message()))
        sys.exit(EXIT_USAGE)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.Abort:
        # click turns a KeyboardInterrupt (and an EOF at a prompt) into Abort.
        interrupted(prog_name, _read_line(command, args, prog_name)[1])
    # Without standalone mode click returns what ctx.exit() was given, or the command's
    # return value (None for every ctx command).
    sys.exit(status if isinstance(status, int) else EXIT_OK)


def _flush_output(prog_name: str) -> None:
    """Write out what standard output still holds; when it cannot be, end the command as one
    whose output failed (a reader that left: quietly, exit 141, as everywhere)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()
    except OutputError as error:
        output_failed(error, prog_name)


def _emit_usage_error(error: CtxError) -> None:
    """The error object on stdout for a --json caller; when stdout is what cannot be written,
    the line on stderr has said it all, and the status stays that of a usage error."""
    try:
        click.echo(json.dumps(error.to_json()))
    except OSError:
        discard_output(sys.stdout)


def _read_line(
    command: click.Command, args: list[str], prog_name: str
) -> tuple[click.Context, bool]:
    """The context of the deepest subcommand ``args`` name, and whether they give ``--json``
    as an option of a command that has one: not as another option's value (``--worker
    --json``), nor among the words after a command's operands that are not its options (a
    tool's argv), nor as an operand after ``--``.  Click leaves the context out of the error
    of an option given without its value, whose usage lines are then that command's."""
    context = click.Context(command, info_name=prog_name, **command.context_settings)
    asks_for_json = value_next = False
    for word in args:
        if value_next:
            value_next = False
            continue
        if word == "--":
            break
        subcommand = _subcommand(context, word)
        if subcommand is not None:
            context = subcommand
            continue
        option = _option_named(context, word.partition("=")[0])
        if option is not None:
            asks_for_json = asks_for_json or "--json" in option.opts
            value_next = not option.is_flag and not option.count and "=" not in word
        elif not word.startswith("-") and not context.allow_interspersed_args:
            break  # its operands begin: what follows is theirs
    return context, asks_for_json


def _subcommand(context: click.Context, word: str) -> click.Context | None:
    if not isinstance(context.command, click.Group):
        return None
    found = context.command.get_command(context, word)
    if found is None:
        return None
    return click.Context(found, info_name=word, parent=context, **found.context_settings)


def _option_named(context: click.Context, name: str) -> click.Option | None:
    for parameter in context.command.get_params(context):
        if isinstance(parameter, click.Option) and name in (
            *parameter.opts,
            *parameter.secondary_opts,
        ):
            return parameter
    return None


def _show_usage_error(
    error: click.UsageError, context: click.Context | None, prog_name: str
) -> None:
    if context is not None:
        hint = ""
        if context.command.get_help_option(context) is not None:
            longest = max(context.command.get_help_option_names(context), key=len)
            hint = f"Try '{context.command_path} {longest}' for help.\n"
        click.echo(f"{context.get_usage()}\n{hint}", err=True)
    click.echo(printable(f"{prog_name}: EINVAL: {error.format_message()}"), err=True)
