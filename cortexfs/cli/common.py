"""What every ``ctx`` command shares: the storage option, error rendering, JSON output.

Commands are thin (CONVENTIONS): parse, call one library function, render.  Exit statuses
(SPEC §2.4): 0 success, 1 operation refused or conflict found, 2 usage error, 3 nothing to do;
74 when standard output could not be written (:func:`output_failed`).

An output that cannot be written (``> /dev/full``, a full disk) ends every command the same
way (:func:`cortexfs.cli.exits.output_failed`, reached from here for the click commands):
``ctx: ENOSPC: cannot write standard output (…)``, then what the command had already
changed, as it said with :func:`changed` (``job J was finished (do not finish it again)``),
so that a command whose change is done is not taken as refused and run twice.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from cortexfs import jsontext, storage
from cortexfs.cli import exits
from cortexfs.cli.exits import (  # noqa: F401  (re-exported: every command takes them from here)
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_OUTPUT_FAILED,
    EXIT_READER_GONE,
    EXIT_REFUSED,
    EXIT_USAGE,
    changed,
    exit_status,
    under_way,
    usage_problem,
)
from cortexfs.cli.params import NonEmptyPath
from cortexfs.cli.suggested import absolute, naming_the_root
from cortexfs.errors import CtxError, explain_host_trouble
from cortexfs.names import check_object_name
from cortexfs.printable import printable, shell_words
from cortexfs.standard_streams import (
    OutputError,
    closed_at_start,
    discard_output,
    open_write_only,
    writes_utf8,
)

F = TypeVar("F", bound=Callable[..., Any])


def storage_option(fn: F) -> F:
    """``--storage DIR`` on a subcommand; overrides the group's and ``$CTX_STORAGE``."""
    return click.option(
        "--storage",
        "storage_dir",
        type=NonEmptyPath(file_okay=False, path_type=Path),
        default=None,
        help="Storage root (default: $CTX_STORAGE, else the embedded default root).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)


STORAGE_SELECTION_KEY = "cortexfs.storage_selection"


def resolve_storage(storage_dir: Path | None) -> Path:
    """The storage root for this command: subcommand option, then the group's, then R-1."""
    ctx = click.get_current_context(silent=True)
    root_ctx = ctx.find_root() if ctx else None
    if root_ctx is not None and root_ctx.obj:
        try:
            storage_dir = storage.one_storage_option(root_ctx.obj.get("storage"), storage_dir)
        except CtxError as error:
            raise usage_problem(error) from None
    if storage_dir is not None and ctx is not None:
        ctx.meta[STORAGE_SELECTION_KEY] = absolute(storage_dir)
    return storage.resolve_root(storage_dir)


def for_this_storage(text: str) -> str:
    """``text`` with every ``'ctx …'`` command it suggests naming the storage root this
    command was given with ``--storage`` (:mod:`cortexfs.cli.suggested`), where
    :func:`where_storage_goes` puts it."""
    ctx = click.get_current_context(silent=True)
    root = ctx.meta.get(STORAGE_SELECTION_KEY) if ctx is not None else None
    if ctx is None or root is None:
        return text
    return naming_the_root(text, root, where_storage_goes(ctx.find_root().command, ctx))


def where_storage_goes(
    group: click.Command, ctx: click.Context
) -> Callable[[list[str]], int | None]:
    """Where ``--storage S`` goes in the words of a suggested command: at the end when the
    command takes ``--storage`` itself, so the suggestion reads as before with the option
    added (``'ctx bootstrap --storage S'``); after ``ctx`` for ``run``, whose last words are
    the tool's (``'ctx --storage S run --agent A TOOL'``); nowhere for a command that works
    on no storage root (``umount``)."""

    def place(words: list[str]) -> int | None:
        command, depth = group, 0
        while isinstance(command, click.Group) and depth < len(words):
            sub = command.get_command(ctx, words[depth])
            if sub is None:
                break
            command, depth = sub, depth + 1
        if command is group:
            return 0
        if any(isinstance(param, click.Argument) and param.nargs == -1 for param in command.params):
            return 0
        if any("--storage" in param.opts for param in command.params):
            return len(words)
        return None

    return place


QUEUE_SELECTION_KEY = "cortexfs.queue_selection"
_SUGGESTED_QUEUE_COMMAND = re.compile(r"'(ctx queue [a-z][^']*)'")


def select_queue_in_suggestions(
    storage_dir: Path | None, project: str | None, queue_arg: Path | None
) -> None:
    """Remember how this command was told its queue, for :func:`for_this_queue`: the options
    as the user gave them (a path made absolute), never what the environment said
    ($CTX_STORAGE, $CTX_PROJECT), which a command run next in the same shell has as well."""
    words: list[str] = []
    if storage_dir is None:
        root_ctx = click.get_current_context().find_root()
        storage_dir = root_ctx.obj.get("storage") if root_ctx.obj else None  # ctx --storage
    if storage_dir is not None:
        words += ["--storage", absolute(storage_dir)]
    if queue_arg is not None:
        words += ["--queue", absolute(queue_arg)]
    elif project is not None:
        words += ["--project", absolute(project) if "/" in project else project]
    click.get_current_context().meta[QUEUE_SELECTION_KEY] = shell_words(words)


def for_this_queue(text: str) -> str:
    """``text`` with every ``'ctx queue …'`` command it suggests naming the queue this
    command was given (``'ctx queue recover --reconcile --project P'``), so that the
    suggestion, copied, acts on the same queue and not on $CTX_PROJECT's or on none."""
    return suggestions_for_this_queue()(text)


def for_this_queue_in(document: Any) -> Any:
    """``document`` (what ``--json`` prints) with :func:`for_this_queue` applied to each of
    its strings: a suggestion in a report's detail names the queue as the text output's does."""
    rewrite = suggestions_for_this_queue()

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return rewrite(value)
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(document)


def suggestions_for_this_queue() -> Callable[[str], str]:
    """:func:`for_this_queue` as this command's context has it now, for threads that have no
    context of their own (a worker's)."""
    ctx = click.get_current_context(silent=True)
    selection = ctx.meta.get(QUEUE_SELECTION_KEY) if ctx is not None else None
    if not selection:
        return lambda text: text
    return lambda text: _SUGGESTED_QUEUE_COMMAND.sub(
        lambda suggested: f"'{suggested[1]} {selection}'", text
    )


def emit_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=None, sort_keys=False, default=str))


def readable_json(value: Any, separators: tuple[str, str] | None = None) -> str:
    """``value`` as JSON in readable UTF-8, or all escaped when it holds a lone surrogate:
    JSON can spell ``"\\ud800"``, requests and events keep it as it came (escaped), but no
    UTF-8 output can hold the character itself.  For text that :func:`printable` shows."""
    return jsontext.dumps_utf8(value, separators=separators).decode()


def terminal_json(value: Any, separators: tuple[str, str] | None = None) -> str:
    """:func:`readable_json` for output that stays JSON (``--json``), where a character a
    terminal may act on and JSON leaves raw (a C1 control such as U+009B, which starts an
    escape sequence, DEL, a bidirectional override: whatever :func:`printable` escapes) is
    written ``\\u009b``, which every JSON reader reads as the same character (T-3)."""
    text = readable_json(value, separators)
    # Under a locale of a narrow charset (ISO-8859-1…) the characters beyond ASCII are
    # escaped too: written in that charset, the output would not be the UTF-8 JSON requires.
    ascii_only = not writes_utf8(sys.stdout)
    if text.isprintable() and (text.isascii() or not ascii_only):
        return text
    return "".join(
        char
        if (char.isprintable() or char == "\n") and (char.isascii() or not ascii_only)
        else _json_escape(char)
        for char in text
    )


def _json_escape(char: str) -> str:
    """``char`` as JSON's ``\\uXXXX``, a surrogate pair beyond the first plane."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def require_standard_input(what: str) -> None:
    """EBADF when standard input was closed at start (``<&-``) and '-' asks for ``what`` (a
    request, a result, a policy): it then reads as /dev/null, and its emptiness would be taken
    for the ``what`` given — an empty result recorded, an empty policy judged valid.  EBADF
    too, naming it, when it was opened for writing only (``0>>FILE``)."""
    if closed_at_start(0):
        state = "closed: there is no"
    elif open_write_only(0):
        state = "open for writing only (as '0>FILE' or '0>>FILE' opens it): there is no"
    else:
        return
    raise CtxError(
        errno.EBADF,
        f"standard input is {state} {what} to read; give a FILE, or pipe the {what} in; "
        "nothing was done",
    )


def echo_printable(text: str, *, err: bool = False) -> None:
    """``click.echo`` of :func:`printable` ``text``; on stderr (a note, a warning) with the
    commands it suggests naming the storage root this command was given
    (:func:`for_this_storage`), as a refusal's do."""
    click.echo(printable(for_this_storage(text) if err else text), err=err)


def is_utf8_text(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def fail(error: CtxError, *, as_json: bool = False) -> None:
    """Render a refusal (stderr text; also the JSON object on stdout with --json) and exit."""
    # The last use of the message (the command ends): its suggestions name the queue and
    # the storage root this command was given, so that copied they act on the same ones.
    error.message = for_this_storage(for_this_queue(error.message))
    click.echo(f"{_program()}: {printable(str(error))}", err=True)
    if as_json:
        emit_json_error(error)
    sys.exit(exit_status(error))


def output_failed(error: OSError, prog_name: str | None = None) -> NoReturn:
    """End a command whose standard output could not be written, as
    :func:`cortexfs.cli.exits.output_failed` says, named as the user typed it, and suggesting
    commands on the queue and storage root it was given, as :func:`fail` does."""
    exits.output_failed(
        error, prog_name or _program(), lambda text: for_this_storage(for_this_queue(text))
    )


def emit_json_error(error: CtxError) -> None:
    """The error object on stdout, unless stdout is what failed (``--json > /dev/full``, a
    reader that left): the line on stderr has said it all then."""
    try:
        emit_json(error.to_json())
        sys.stdout.flush()
    except OSError:
        discard_output(sys.stdout)


def _program() -> str:
    """The command the user typed (``ctx``, ``ctxmcp``), to start an error line with."""
    ctx = click.get_current_context(silent=True)
    return (ctx.find_root().info_name if ctx else None) or "ctx"


def fail_with_problems(source: object, error: CtxError, problems: list[str], as_json: bool) -> None:
    """Refuse a file with every reason listed, one ``ctx: EINVAL: SOURCE: <reason>`` line each
    on standard error (the form of every ctx error; the error object on stdout with --json),
    then exit 1.  (``ctx policy check`` and ``ctx object check``, which report on files rather
    than refuse them, print ``SOURCE: EINVAL: <reason>`` lines as a linter does: P-8.)"""
    for problem in problems:
        click.echo(printable(f"{_program()}: {error.code_name}: {source}: {problem}"), err=True)
    if as_json:
        emit_json_error(error)
    sys.exit(exit_status(error))


def object_name_argument(name: str, kind: str) -> str:
    """A command-line object name (R-3); a malformed one is a usage error (exit 2)."""
    try:
        return check_object_name(name, kind)
    except CtxError as exc:
        raise usage_problem(exc) from None


def handles_errors(fn: F) -> F:
    """Turn a :class:`CtxError` (or an OSError the library did not expect) into an exit status."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except CtxError as exc:
            _settle_stdout()
            fail(exc, as_json=as_json)
        except BrokenPipeError:
            exits.reader_gone()  # the reader of our output left (`ctx queue status | head -1`)
        except OutputError as exc:
            output_failed(exc)
        except OSError as exc:
            _settle_stdout()
            fail(unexpected_error(exc), as_json=as_json)

    return wrapper  # type: ignore[return-value]


def unexpected_error(exc: OSError) -> CtxError:
    """An OSError no library call turned into a sentence: its errno and the path it names;
    for an EACCES on the way to that path (another user's storage root, under a home only
    its owner may enter), the directory that refused and what to do; for what the host ran
    short of (EMFILE, ENOSPC…) or a read-only filesystem, what mends it."""
    # A descriptor's number (os.read on an fd) names nothing the user gave.
    where = exc.filename if isinstance(exc.filename, str | bytes | os.PathLike) else ""
    said = str(exc.strerror)
    if where:
        path = os.fsdecode(where)
        if exc.errno == errno.EACCES:
            refusal = storage.not_reachable(Path(path), f"reach {path}")
            if refusal is not None:
                return refusal
        said = f"{path}: {said}"
    elif exc.errno == errno.ENOENT and _current_directory_removed():
        # getcwd's refusal, met making a relative path absolute: it names no path at all.
        said = (
            "the current directory no longer exists, and a relative path given is read "
            "against it; give absolute paths, or change to a directory that exists"
        )
    trouble = explain_host_trouble(exc.errno)
    if trouble is not None:
        # What the host ran short of is mended outside the command, never by changing what
        # it was given: say what, as every command that meets it on a known step does.
        said = f"{said}{trouble.aside}: {trouble.remedy}, then run the command again"
    return CtxError(exc.errno or 5, said)


def _current_directory_removed() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def _settle_stdout() -> None:
    """Write out what standard output still holds before an error is reported; when it
    cannot be written (a full disk, ``> /dev/full``), drop it, so that the interpreter's last
    flush does not fail again and turn the command's exit status into 120."""
    try:
        sys.stdout.flush()
    except OSError:
        discard_output(sys.stdout)
