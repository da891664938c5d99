"""``ctx run``: run one tool as an agent, in terminal CLI or agent native mode (SPEC T-3).

This command parses with argparse, not click (see :mod:`cortexfs.cli`): it imports only
what a call needs, because it is started once per tool call.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import functools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from cortexfs import jsontext, storage
from cortexfs.cli.exits import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    changed,
    exit_status,
    interrupted,
    output_failed,
    reader_gone,
    usage_problem,
)
from cortexfs.cli.suggested import absolute, naming_the_root
from cortexfs.errors import CtxError, describe
from cortexfs.interrupts import Stopped, stops_raise
from cortexfs.names import check_object_name, shown_number
from cortexfs.printable import printable
from cortexfs.regular_file import read_up_to
from cortexfs.shared.sessions import DEFAULT_SESSION, SessionRef
from cortexfs.standard_streams import (
    OutputError,
    closed_at_start,
    open_write_only,
    tell_output_errors,
    write_some,
)
from cortexfs.timefmt import MAX_SECONDS, SECONDS_TEXT, rfc3339
from cortexfs.tools import orphans
from cortexfs.tools.core.toolio import MAX_INPUT_BYTES, NATIVE
from cortexfs.tools.result import ERROR, ToolError, ToolResult
from cortexfs.tools.runner import DEFAULT_TIMEOUT, UnreadableInput, run_native, run_terminal
from cortexfs.tools.spawn import SIGNALLED_GRACE

# The shell's convention for a command that was not found / could not be run (terminal mode).
EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126

# Where native mode writes its frames: the descriptor, whatever sys.stdout is.
_STANDARD_OUTPUT = 1

SUMMARY = "Run TOOL as AGENT through the whole authority chain (SPEC T-3, P-5, P-6)."
DESCRIPTION = f"""{SUMMARY}

Options of ctx run come before TOOL; every word after TOOL is the tool's,
passed exactly as given ('--' and words that look like options included).  A
'--' before TOOL ends the options, for a TOOL that starts with '-'.

Terminal CLI mode (default): ARGs are passed as they are, stdin/stdout/stderr
are the tool's (what the tool cannot write is its own business); the exit
status is the tool's (126: refused, 127: not found; 1 when it exited 0 but its
result could not be recorded).  In either mode a malformed command line (an
agent, tool, space or session name that is not an object name, R-3) is EINVAL,
exit 2, nothing run or recorded.

Native mode (--native): the tool's JSON input, at most 16 MiB (else EFBIG,
exit 1, nothing run or recorded), is read from stdin and checked against its
schema; stdout carries JSONL frames, one object per line:
  {{"type": "call", ...}}    the tool started (call id, pid)
  {{"type": "stderr", ...}}  one line of the tool's stderr
  {{"type": "result", ...}}  the outcome: status, output, exit_status,
                           error (errno, stage, denying chain step),
                           timings; always the last frame
Exit 0 when the result is ok, 2 for input that is not JSON or that its
schema refuses (EINVAL), 1 otherwise.  When a frame cannot be written (a full
disk, > /dev/full): exit 74, 'ctx: ENOSPC: cannot write standard output (...)'
and whether the tool ran and where its result is recorded; a first frame that
cannot be written kills the tool before it is given its input (stage output;
its process had started, so it may have begun to act, but it read no input).
A standard output closed at start ('>&-') is refused so before anything is run
or recorded (EBADF, exit 74).  A reader that left (a closed pipe) ends it
quietly, exit 141.

In either mode, Ctrl-C, SIGTERM or SIGHUP to ctx run stops the tool's process
group and records the call as ended (EINTR, the result frame in native mode);
exit 128 + the signal's number (130, 143, 129).  In terminal mode the group is
given the signal first, and killed if it still runs 2 s later.

Only the host administrator (root, or the owner of the storage root) may run
tools as an agent.  Every call is recorded in the session's events.jsonl and
the tool's log."""


USAGE = "ctx run [OPTIONS] TOOL [ARGS]..."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A malformed command line, reported as click reports one for every other command:
        the usage, where help is, then the reason as every ctx error reads."""
        reason = _in_clicks_words(message)
        self.exit(
            EXIT_USAGE, f"Usage: {USAGE}\nTry 'ctx run --help' for help.\n\nctx: EINVAL: {reason}\n"
        )


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The help's usage line begins ``Usage:``, as every other command's does."""

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


_MISSING = "the following arguments are required: "
_NO_VALUE = re.compile(r"argument (-[^:]*): expected one argument")
_BAD_VALUE = re.compile(r"argument (-[^:]*): (.*)", re.DOTALL)


def _in_clicks_words(message: str) -> str:
    """argparse's sentence for a missing option or argument, an option given without its
    value or with a bad one, as click says it for the other commands (the first missing one,
    as click)."""
    if message.startswith(_MISSING):
        first = message[len(_MISSING) :].split(", ")[0]
        return f"Missing {'option' if first.startswith('-') else 'argument'} '{first}'."
    no_value = _NO_VALUE.fullmatch(message)
    if no_value:
        return f"Option '{no_value.group(1).split('/')[0]}' requires an argument."
    bad_value = _BAD_VALUE.fullmatch(message)
    if bad_value:
        return f"Invalid value for '{bad_value.group(1).split('/')[0]}': {bad_value.group(2)}"
    return message


def _parser() -> tuple[argparse.ArgumentParser, dict[str, bool]]:
    """The parser, and whether each of its option strings takes a value."""
    # argparse makes a help formatter for every argument it adds (to check its metavar), and a
    # formatter of the terminal's width imports shutil, with zlib, bz2 and lzma: milliseconds
    # of every call, for the width of a text only --help and errors print.  So the parser is
    # built with formatters of a set width, and given the real one once built.
    parser = _Parser(
        prog="ctx run",
        allow_abbrev=False,  # '--nat' is no '--native', as click takes no '--proj' elsewhere
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=functools.partial(_Formatter, width=80),
    )
    options = [
        parser.add_argument(
            "--agent",
            required=True,
            help="the agent whose identity, mounts and policy apply [required]",
        ),
        parser.add_argument(
            "--session",
            default=DEFAULT_SESSION,
            help=f"session to record in (default: {DEFAULT_SESSION})",
        ),
        parser.add_argument(
            "--project", help="record in shared/PROJECT/agent/AGENT/session/SESSION instead"
        ),
        parser.add_argument(
            "--native",
            action="store_true",
            help="agent native mode: JSON on stdin, JSONL frames out",
        ),
        parser.add_argument(
            "--timeout",
            type=_positive_seconds,
            help=f"kill the tool's process group after this many seconds (native default "
            f"{DEFAULT_TIMEOUT:g}; terminal default: none)",
        ),
        parser.add_argument(
            "--storage",
            type=_path,
            help="storage root (default: $CTX_STORAGE, else the embedded default root)",
        ),
    ]
    parser.add_argument("tool", metavar="TOOL")
    # Shown in the usage only: the words after TOOL never reach argparse (see _split).
    parser.add_argument(
        "args", metavar="ARGS", nargs="*", default=[], help="the tool's argv, exactly"
    )
    parser.formatter_class = _Formatter
    takes_value = {"-h": False, "--help": False}
    for action in options:
        takes_value.update(dict.fromkeys(action.option_strings, action.nargs != 0))
    return parser, takes_value


# The options whose value '--' may be: a name (R-3, judged as any other: an illegal one), and a
# storage root, a directory '--' names as click's --storage takes it for every other command
# .  A timeout of '--' is no number of seconds.
_DOUBLE_DASH_VALUES = {"agent": str, "session": str, "project": str, "storage": Path}


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """``ctx run``'s options and TOOL, and the tool's argv: every word after TOOL, exactly.

    argparse would take a ``--`` right after TOOL as its own (``demo.echo -- a`` gave the
    tool ``[a]``, ``-- -- b`` gave ``[--] [b]``), so the words after TOOL never reach it (T-3:
    the argv is kept).
    """
    parser, takes_value = _parser()
    own, tool, tool_argv = _split(argv, takes_value)
    _refuse_unknown_options(parser, own, takes_value)
    own = _joined_with_values(own, takes_value)
    options = parser.parse_args([*own, "--", *tool] if tool else own)
    # argparse takes the '--' of '--agent=--' for its own and leaves an empty list: the value
    # given was '--', judged as any other (an illegal name, the directory '--'; no number).
    for dest in [dest for dest, value in vars(options).items() if value == [] and dest != "args"]:
        if dest not in _DOUBLE_DASH_VALUES:
            parser.error(f"argument --{dest}: invalid value: '--'")
        setattr(options, dest, _DOUBLE_DASH_VALUES[dest]("--"))
    if options.native and tool_argv:
        parser.error("native mode takes its input on stdin, not as arguments")
    options.args = tool_argv
    return options


def _split(argv: list[str], takes_value: dict[str, bool]) -> tuple[list[str], list[str], list[str]]:
    """``argv`` as ctx run's options, ``[TOOL]`` (empty when absent), and the tool's words."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":  # the end of ctx run's options: TOOL may then start with '-'
            return argv[:index], argv[index + 1 : index + 2], argv[index + 2 :]
        if not word.startswith("-") or word == "-":
            return argv[:index], [word], argv[index + 1 :]
        name, equals, _ = word.partition("=")
        index += 2 if not equals and _option_takes_value(name, takes_value) else 1
    return argv, [], []


def _joined_with_values(own: list[str], takes_value: dict[str, bool]) -> list[str]:
    """``own`` with each option that takes a value joined to it (``--storage=-r``): the word
    after such an option is its value whatever it starts with, as click reads every other
    command's options, where argparse would take ``--storage -r`` for a missing value."""
    joined, index = [], 0
    while index < len(own):
        word = own[index]
        if "=" not in word and takes_value.get(word, False) and index + 1 < len(own):
            joined.append(f"{word}={own[index + 1]}")
            index += 2
        else:
            joined.append(word)
            index += 1
    return joined


def _refuse_unknown_options(
    parser: argparse.ArgumentParser, own: list[str], takes_value: dict[str, bool]
) -> None:
    """The first word of ``own`` (ctx run's part of the command line) naming no option of
    ctx run, refused in click's words and with its suggestion; before argparse, which would
    first say that a required option is missing when it was only misspelt."""
    index = 0
    while index < len(own):
        name, equals, _ = own[index].partition("=")
        if name not in takes_value:
            near = difflib.get_close_matches(name, [o for o in takes_value if o[:2] == "--"], 1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            parser.error(f"No such option '{name}'.{hint}")
        index += 2 if not equals and takes_value[name] else 1


def _option_takes_value(name: str, takes_value: dict[str, bool]) -> bool:
    """As argparse reads ``name``: exactly, as click reads every other command's options.
    An unknown option is argparse's to refuse; it takes no value here."""
    return takes_value.get(name, False)


def main(argv: list[str], storage_dir: Path | None = None) -> int:
    """Run ``ctx run ARGV``; ``storage_dir`` is the group's ``--storage``, if one was given.

    What ctx itself writes on standard output (native mode's frames, ``--help``) and cannot
    write ends it as it ends every command (:func:`cortexfs.cli.exits.output_failed`): exit
    74, saying what became of the call; a reader that left, quietly with exit 141.  The output
    of a tool in terminal mode is the tool's own, and so are its failures to write it."""
    tell_output_errors()
    try:
        try:
            status = _main(argv, storage_dir)
        except SystemExit:  # --help, a malformed command line
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        reader_gone()
    except OutputError as error:
        output_failed(error, "ctx")


def _main(argv: list[str], storage_dir: Path | None) -> int:
    options = parse_command_line(argv)
    global _root_given
    try:
        try:
            given = storage.one_storage_option(storage_dir, options.storage)
        except CtxError as error:
            raise usage_problem(error) from None
        _root_given = None if given is None else absolute(given)
        root = storage.resolve_root(given)
        where = _session(root, options.agent, options.tool, options.session, options.project)
    except CtxError as error:
        _say(str(error))
        status = exit_status(error)
        if options.native and status == EXIT_REFUSED:
            _answer_without_a_root(options, error.errno, error.message)
        # Refused before any call was made (an empty CTX_STORAGE names no root): in terminal
        # mode that is the shell's "cannot run" (126), as for a call the runner refuses,
        # never a status the tool could have exited with.
        return EXIT_CANNOT_RUN if status == EXIT_REFUSED and not options.native else status
    except OSError as error:
        _say(describe(error))
        if options.native:  # the frame's error has the errno apart from its sentence
            said = describe(error).split(": ", 1)[-1]
            _answer_without_a_root(options, error.errno or errno.EIO, said)
        return EXIT_REFUSED if options.native else EXIT_CANNOT_RUN
    try:
        with stops_raise():
            if options.native:
                return _run_native(root, options, where)
            # The terminal is lent for the call only: what the call leaves running outside
            # its group (a daemon that left with setsid, keeping that terminal) is this
            # command's to end as it returns.
            with orphans.adopting():
                return _run_terminal(root, options, where)
    except Stopped as stop:
        interrupted("ctx", False, stop.signum)  # the native caller had the result frame
    except CtxError as error:
        _say(str(error))
        return exit_status(error)
    except (BrokenPipeError, OutputError):
        raise  # ctx's own output: main ends the command as every command ends then
    except OSError as error:
        _say(describe(error))
        return EXIT_REFUSED


def _run_terminal(root: Path, options: argparse.Namespace, where: SessionRef | str) -> int:
    result = run_terminal(
        root,
        options.agent,
        options.tool,
        options.args,
        session=where,
        timeout=options.timeout,
        signalled_grace=SIGNALLED_GRACE,
    )
    if result.exit_status is None and result.error is not None:
        _say(str(result.error))
        missing = result.error.errno == errno.ENOENT and result.error.stage == "resolve"
        return EXIT_NOT_FOUND if missing else EXIT_CANNOT_RUN
    if result.error is not None and result.error.stage == "run":
        _say(str(result.error))
    if result.passed_on is not None and result.error is not None and result.error.stage == "run":
        # Ended as the signal asked of ctx run (its help), whatever the tool exited with: it
        # may have handled the signal and exited 0, or ignored it and been killed, an exit
        # status no caller of ctx run sent.
        return 128 + result.passed_on
    if result.error is not None and result.error.stage == "record":
        _say(str(result.error))  # the tool's output is out; the record of it is not
        return result.exit_status or EXIT_REFUSED
    return result.exit_status or 0


def _run_native(root: Path, options: argparse.Namespace, where: SessionRef | str) -> int:
    if closed_at_start(_STANDARD_OUTPUT):
        # Reopened on /dev/null at start: the frames, the whole answer, would go nowhere, and
        # a tool run so would do its work unseen.  Refused with the errno of an output that
        # cannot take the call frame (1</dev/null), but before anything is run or recorded.
        raise OutputError(
            errno.EBADF,
            "closed when ctx started ('>&-'), and native mode writes its frames there; nothing "
            "was run or recorded: run ctx with standard output open (redirect it to a file to "
            "keep the frames)",
        )
    # As much as a core tool reads as its input, and not a byte more than one past it: a
    # source that never ends (/dev/zero) is refused before it fills memory, and nothing runs.
    # A stdin closed at start reads as /dev/null: its emptiness would be taken for an empty
    # input, refused as unusable and recorded as the call's, where no input was given at all.
    if closed_at_start(sys.stdin.fileno()):
        state = "closed when ctx started ('<&-')"
    elif open_write_only(sys.stdin.fileno()):
        state = "open for writing only (as '0>FILE' or '0>>FILE' opens it)"
    else:
        state = None
    if state is not None:
        raise CtxError(
            errno.EBADF,
            f"standard input is {state}: native mode reads the tool's input from it; pipe the "
            "input in; nothing was run or recorded",
        )
    data = read_up_to(sys.stdin.fileno(), MAX_INPUT_BYTES)
    if len(data) > MAX_INPUT_BYTES:
        raise CtxError(
            errno.EFBIG,
            f"standard input holds more than {MAX_INPUT_BYTES} bytes, more than a tool's "
            "input may; nothing was run",
        )
    try:
        # Strict: a name given twice would have the tool run with the value a reviewer of
        # the logged input did not see first; NaN, 1e999 and deep nesting no reader agrees on.
        input_value: Any = jsontext.loads_strict(data)
    except ValueError as exc:
        # Refused by the runner, so that the caller still gets its result frame and the
        # session its tool_call/tool_result (exit 2, as for an input its schema refuses).
        input_value = UnreadableInput(data.decode("utf-8", "replace"), _not_json(exc))
    frames = _Frames()
    try:
        result = run_native(
            root,
            options.agent,
            options.tool,
            input_value,
            session=where,
            timeout=DEFAULT_TIMEOUT if options.timeout is None else options.timeout,
            observer=frames,
        )
    except (KeyboardInterrupt, Stopped):
        # A stop that cut the result frame leaves it whole too; the stop is what ends ctx,
        # whatever becomes of the rest.
        with contextlib.suppress(OSError):
            frames.finish_begun()
        raise
    if frames.lost is not None:
        changed(_what_became_of(result))
        raise frames.lost
    return _native_exit(result)


class _Frames:
    """The observer of a native call: each frame one line on standard output, written out as
    it comes.  The first that cannot be written is :attr:`lost`; the runner then gives no more
    (and runs no tool whose ``call`` frame it was), and the call's result is still recorded.

    A stop (Ctrl-C, SIGTERM) may come while a frame waits for a slow reader; each frame still
    reaches standard output at most once, and whole.  It is written straight to the
    descriptor, counting what went out, where a buffered stream would keep the frame a stop
    interrupted and write it again with the next one.  A frame the stop cut before any of it
    went out is dropped: a stop that came as that write ended leaves no count to say it went
    out (a frame of up to 4 KiB goes into a pipe in one write or not at all).  One cut after
    is finished before the next frame, which after a stop is the ``result``."""

    def __init__(self) -> None:
        self.lost: OSError | None = None
        self.begun = memoryview(b"")  # what a stop left unwritten of a frame begun

    def __call__(self, frame: dict[str, Any]) -> None:
        try:
            self.finish_begun()
            self._write(memoryview((json.dumps(frame, default=str) + "\n").encode()))
        except OSError as error:
            self.lost = error
            raise

    def finish_begun(self) -> None:
        """Write the rest of the frame a stop cut after its first bytes, if any (none once
        the frames are lost: the runner gives no more)."""
        if self.lost is None:
            self._write(self.begun)

    def _write(self, line: memoryview) -> None:
        while line:
            line = line[write_some(_STANDARD_OUTPUT, line) :]
            self.begun = line


def _answer_without_a_root(options: argparse.Namespace, code: int, message: str) -> None:
    """The ``result`` frame of a native call refused before the runner could be given a
    storage root (one named through a loop of links, an empty CTX_STORAGE): native mode's
    answer comes always, last, as the runner's does for a root that does not exist (stage
    ``agent``, nothing run or recorded)."""
    now = rfc3339()
    result = ToolResult(
        status=ERROR,
        tool=options.tool,
        agent=options.agent,
        session="",
        call=os.urandom(8).hex(),
        mode=NATIVE,
        started=now,
        finished=now,
        error=ToolError(code, "agent", message),
    )
    try:
        _Frames()({"type": "result", **result.to_json()})
    except OSError:
        # Said as for every other call whose frame is lost (_run_native): its caller has no
        # other way to learn that the tool did not run and nothing was recorded.
        changed(_what_became_of(result))
        raise


def _what_became_of(result: ToolResult) -> str:
    """Whether the tool ran and whether its result is recorded, said when its frames could not
    be written: its caller has no other way to learn it, and must not run it twice."""
    error = result.error
    failure = "" if error is None else f" ({error} [{error.stage}])"
    if error is not None and error.stage == "output":
        ran = f"{result.tool} was killed before it was given its input (its process had started)"
    elif result.exit_status is None:
        ran = f"{result.tool} did not run{failure}"
    else:
        ran = f"{result.tool} ran and exited {result.exit_status}"
        if error is not None and error.stage not in ("exit", "record"):
            ran += failure  # timed out, killed for its output or for its caller's interrupt
    if result.recorded:
        said = f"{ran}; the call is recorded in session {result.session}"
        if result.record_error is not None:
            # The session, written first, holds the call: only the tool's log refused its
            # line (T-7), and the reason names it.
            said += f", but not in the tool's log ({result.record_error})"
        return said
    if result.session:
        return f"{ran}, but the call could not be recorded in session {result.session}"
    return f"{ran}; nothing was recorded"


def _native_exit(result: ToolResult) -> int:
    """0 for ``ok``; 2 for an input that is not JSON or that the schema refuses (EINVAL at
    stage ``schema``), which the caller must change; 1 for every other failure, a schema
    check that ran out of the call's time (ETIMEDOUT) or a damaged schema (ENOEXEC) too."""
    if result.ok:
        return EXIT_OK
    error = result.error
    if error is not None and (error.errno, error.stage) == (errno.EINVAL, "schema"):
        return EXIT_USAGE
    return EXIT_REFUSED


def _session(
    root: Path, agent: str, tool: str, session: str, project: str | None
) -> SessionRef | str:
    """Where the call is recorded.  Every name on the command line is checked first (R-3): an
    illegal one is a malformed command line (EINVAL, exit 2), in either mode, before
    anything is run or recorded."""
    try:
        for name, kind in ((agent, "agent"), (tool, "tool"), (session, "session")):
            check_object_name(name, kind)
        if project is None:
            return session
        return SessionRef.shared(root, project, agent, session)
    except CtxError as error:
        if error.errno == errno.EINVAL:
            raise usage_problem(error) from None
        raise


def _not_json(error: ValueError) -> str:
    if isinstance(error, jsontext.DuplicateNames):
        return f"it {jsontext.duplicate_names_problem(error.names)}"
    if isinstance(error, jsontext.NotAJsonNumber):
        return f"it {jsontext.not_a_json_number_problem(error)}"
    return str(error)


def _positive_seconds(text: str) -> float:
    if not SECONDS_TEXT.fullmatch(text):  # as the other commands read seconds (cli/params.py)
        raise argparse.ArgumentTypeError(f"{shown_number(text)} is not a number of seconds")
    seconds = float(text)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    if seconds > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than a year and a day ({MAX_SECONDS:.0f} seconds)"
        )
    return seconds


def _path(text: str) -> Path:
    """A path; an empty string is none (``Path("")`` would be the current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty string names no path")
    return Path(text)


# The storage root the command line named (--storage), for the commands a refusal suggests.
_root_given: str | None = None


def _say(message: str) -> None:
    """A refusal on stderr, escaped: it quotes paths, controls and hooks' words that others
    wrote (T-3); the commands it suggests name the storage root the command line named."""
    if _root_given is not None and "'ctx " in message:
        # Only here, on the way out of a refused call: the command tree is click's, which a
        # call does not load (cortexfs.cli).
        import click

        from cortexfs.cli.common import where_storage_goes
        from cortexfs.cli.group import main as group

        place = where_storage_goes(group, click.Context(group))
        message = naming_the_root(message, _root_given, place)
    print(printable(f"ctx: {message}"), file=sys.stderr)
