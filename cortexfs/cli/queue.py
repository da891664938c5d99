"""``ctx queue …``: the queue command line of SPEC §2.4, thin over :mod:`cortexfs.queue`.

Exit statuses: 0 success, 1 operation refused or conflict found, 2 usage error, 3 nothing
to claim.  In text mode ``publish`` and ``claim`` print the job name alone on stdout.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, NoReturn, TypeVar

import click

from cortexfs import storage
from cortexfs.cli.columns import table
from cortexfs.cli.common import (
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_REFUSED,
    changed,
    echo_printable,
    emit_json,
    fail,
    for_this_queue,
    for_this_queue_in,
    handles_errors,
    readable_json,
    require_standard_input,
    resolve_storage,
    select_queue_in_suggestions,
    usage_problem,
)
from cortexfs.cli.lazy import LazyGroup
from cortexfs.cli.params import Integer, NonEmptyPath, Seconds
from cortexfs.errors import CtxError, invalid
from cortexfs.interrupts import held_interrupts
from cortexfs.jsontext import NotAJsonNumber
from cortexfs.names import is_object_name, job_name
from cortexfs.queue import inspect, layout, protocol, recovery
from cortexfs.queue.claim_order import HintedClaimOrder
from cortexfs.queue.evidence import REGULAR_FILE
from cortexfs.queue.holder import (
    Holder,
    Lease,
    calling_process,
    check_ttl,
    check_worker_id,
    judge,
)
from cortexfs.queue.requests import (
    loads_json,
    not_a_json_number,
    parse_batch,
    parse_request_bytes,
    read_at_most,
)
from cortexfs.standard_streams import (
    OutputError,
    closed_at_start,
    discard_output,
    standard_input,
)

F = TypeVar("F", bound=Callable[..., Any])


def queue_options(fn: F) -> F:
    """``--storage``, ``--project`` / ``--queue`` and ``--json``, resolved to ``queue_dir``."""

    @click.option(
        "--storage",
        "storage_dir",
        type=NonEmptyPath(file_okay=False, path_type=Path),
        help="Storage root (default: $CTX_STORAGE, else the embedded default root).",
    )
    @click.option(
        "--project",
        "-p",
        help="Project name: the queue is shared/PROJECT/queue (default: $CTX_PROJECT).  A "
        "value with a '/' in it is the path of a queue directory (names never contain '/').",
    )
    @click.option(
        "--queue",
        "queue_arg",
        type=NonEmptyPath(file_okay=False, path_type=Path),
        help="Path of a queue directory, instead of --project.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
    @functools.wraps(fn)
    def wrapper(
        storage_dir: Path | None, project: str | None, queue_arg: Path | None, **kwargs: Any
    ) -> Any:
        kwargs["queue_dir"] = _queue_dir(storage_dir, project, queue_arg)
        select_queue_in_suggestions(storage_dir, project, queue_arg)
        if kwargs["as_json"]:
            require_output("its JSON output")
        return fn(**kwargs)

    return wrapper  # type: ignore[return-value]


STORAGE_ROOT_KEY = "cortexfs.storage_root"


def require_output(what: str) -> None:
    """EBADF, before anything is done, when standard output was closed at start (``>&-``):
    a command whose answer is ``what`` would act and print it into /dev/null, and a job
    published or claimed that way could never be named (SPEC §2.4)."""
    if closed_at_start(1):  # the descriptor, whatever sys.stdout is now
        raise CtxError(
            errno.EBADF,
            f"standard output is closed, so {what} could not be written; nothing was done: "
            "run the command with standard output open (redirect it to a file to keep it)",
        )


def _queue_dir(storage_dir: Path | None, project: str | None, queue_arg: Path | None) -> Path:
    # Commands that need the storage root too (the worker runs tools) find it here.
    root = resolve_storage(storage_dir)
    click.get_current_context().meta[STORAGE_ROOT_KEY] = root
    if queue_arg is not None and project is not None:
        raise click.UsageError("give either --project or --queue, not both")
    if queue_arg is not None:
        return _outside_the_root_abi(root, _absolute(queue_arg, "--queue"), "--queue")
    if project == "":
        raise usage_problem(invalid("--project '' is empty: give a project name (R-3)"))
    if project is None:
        project = os.environ.get("CTX_PROJECT")
    if not project:
        raise click.UsageError("missing --project NAME (or --queue PATH, or $CTX_PROJECT)")
    if "/" in project:
        # SPEC §2.4: "--project NAME (or a queue path)".  An absolute path is a queue path
        # (ctx queue init makes the queue there, as with --queue); a relative value with a '/'
        # counts only when it names an existing queue, so that a mistyped name such as
        # '--project ../escape' never makes a queue outside the storage root.
        if os.path.isabs(project) or _is_queue_directory(Path(project)):
            return _outside_the_root_abi(root, _absolute(Path(project), "--project"), "--project")
        raise usage_problem(
            invalid(
                f"--project {project!r} is neither a project name (a name holds no '/', R-3) "
                f"nor an absolute queue path nor a queue directory (with "
                f"{', '.join(layout.STATE_DIRS)}); make a queue elsewhere with "
                "'ctx queue init --project /ABSOLUTE/PATH' or '--queue DIR'"
            )
        )
    try:
        return layout.queue_path(resolve_storage(storage_dir), project)
    except CtxError as exc:
        raise usage_problem(exc) from None


def _absolute(queue_dir: Path, option: str) -> Path:
    """``queue_dir`` against the current directory, its ``..`` kept for
    :func:`_outside_the_root_abi` to judge."""
    try:
        return queue_dir.absolute()
    except FileNotFoundError:  # getcwd() of a directory that was removed
        raise storage.relative_to_a_removed_directory(queue_dir, option) from None


def _outside_the_root_abi(root: Path, queue_dir: Path, option: str) -> Path:
    """``queue_dir``, unless it lies in the storage root anywhere but ``shared/NAME/queue``.

    A queue path may name a directory outside the root (a queue on its own, or on a shared
    filesystem); inside it, the root holds only the entries of R-2, so ``ROOT/queue`` or
    ``ROOT/tool/queue`` would be a namespace of its own, and is a usage error.
    """
    real_queue = os.path.realpath(queue_dir)
    plain = Path(os.path.normpath(queue_dir))
    if plain != queue_dir and os.path.realpath(plain) == real_queue:
        # Its '..' went up through no symbolic link: the same directory, named without them
        # ('--project ../queue' from the space's data/ is the space's queue).
        queue_dir = plain
    if _is_project_queue(root, queue_dir) and is_object_name(queue_dir.parent.name):
        if queue_dir.parent.name == storage.DOCS_BUNDLE:  # as --project cortexfs-docs is
            raise usage_problem(
                invalid(
                    f"{option} {queue_dir} lies in {storage.DOCS_BUNDLE}, the "
                    "system-maintained manual bundle (X-2), which is no space and holds no "
                    "queue"
                )
            )
        return queue_dir
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, real_queue]) != real_root:
        # Outside by path; inside all the same when a directory above it is the root under
        # another name (a bind mount), through which a ROOT/queue would be made as well.
        place = storage.place_in_root(root, queue_dir)
        if place is None or (
            _is_project_queue_place(place) and place.parts[1] != storage.DOCS_BUNDLE
        ):
            return queue_dir
    leads_to = Path(real_queue)
    if real_queue != os.path.normpath(queue_dir) and _is_project_queue(root, leads_to):
        project = leads_to.parent.name
        raise CtxError(
            errno.ELOOP,
            f"{option} {queue_dir} leads through a symbolic link to project {project}'s queue; "
            f"a queue is reached without following one (Q-8): use --project {project}",
        )
    raise usage_problem(
        invalid(
            f"{option} {queue_dir} lies inside the storage root {root} but is not a "
            "project's queue: the root holds only "
            f"{', '.join(storage.ROOT_ENTRIES)} (R-2), and queues are shared/NAME/queue; "
            "use --project NAME"
        )
    )


def _is_project_queue_place(place: PurePosixPath) -> bool:
    """Whether ``place``, a path within a storage root, is a project's queue there."""
    parts = place.parts
    return (
        len(parts) == 3 and (parts[0], parts[2]) == ("shared", "queue") and is_object_name(parts[1])
    )


def _is_project_queue(root: Path, queue_dir: Path) -> bool:
    """Whether ``queue_dir`` is the queue of a project in storage root ``root``."""
    space = queue_dir.parent
    if queue_dir.name != "queue" or space.parent.name != "shared":
        return False
    return os.path.realpath(space.parent.parent) == os.path.realpath(root)


def open_queue(queue_dir: Path) -> layout.Queue:
    """The queue a command works on.  A project's queue in the storage root is reached without
    following a symlink at ``shared``, ``P`` or ``queue`` (Q-8): one planted there would take
    every job outside the root."""
    return layout.Queue.open(queue_dir, within=project_root(queue_dir))


def project_root(queue_dir: Path) -> Path | None:
    """The storage root ``queue_dir`` is a project's queue of (as the command line spells
    it), or None for a queue anywhere else: what :meth:`layout.Queue.open` walks from
    without following a link (``within``)."""
    root = click.get_current_context().meta[STORAGE_ROOT_KEY]
    return queue_dir.parents[2] if _is_project_queue(root, queue_dir) else None


def _is_queue_directory(path: Path) -> bool:
    return all((path / state).is_dir() for state in layout.STATE_DIRS)


def _is_whole_result(document: Any) -> bool:
    """A result object of SPEC §2.1 rather than an output: status and output, nothing else
    but the fields the finisher fills in."""
    return (
        isinstance(document, dict)
        and document.get("status") in ("ok", "error")
        and "output" in document
        and set(document) <= _RESULT_FIELDS
    )


_RESULT_FIELDS = frozenset({"status", "output", "worker", "started", "finished"})


def ttl_option(
    help_text: str, check: Callable[[float], float] = check_ttl, least: float = 0.0
) -> Callable[[F], F]:
    """``--ttl SECONDS``, checked while click parses (:func:`check_ttl`, or ``check``): a
    lease lifetime that cannot make a date is a usage error before any job moves.  The
    range ``--help`` shows starts above 0, or at ``least`` when ``check`` asks for that."""

    def checked(_ctx: click.Context, _param: click.Parameter, ttl: float | None) -> float | None:
        try:
            return None if ttl is None else check(ttl)
        except CtxError as exc:
            raise click.BadParameter(exc.message) from None

    seconds = Seconds(min=least, min_open=not least)
    return click.option("--ttl", type=seconds, callback=checked, help=help_text)


# A pid Linux can give: 1 to PID_MAX_LIMIT (2**22); a larger number names no process, ever.
PID = Integer(min=1, max=2**22)


def worker_id_option(help_text: str, dest: str = "worker_id") -> Callable[[F], F]:
    """``--worker ID``: recorded in leases and results (:func:`check_worker_id`), checked while
    click parses: a usage error (exit 2) before any job is claimed."""

    def checked(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        try:
            return None if value is None else check_worker_id(value)
        except CtxError as exc:
            raise click.BadParameter(exc.message) from None

    return click.option("--worker", dest, callback=checked, help=help_text)


def _job_argument(name: str) -> str:
    try:
        return job_name(name)
    except CtxError as exc:
        raise usage_problem(exc) from None


@contextlib.contextmanager
def _opened_input(source: str, what: str) -> Iterator[BinaryIO]:
    """FILE, or standard input for ``-``, which holds ``what`` (a request, a result); read it
    with a limit (:func:`read_at_most`)."""
    if source == "-":
        require_standard_input(what)  # closed, it would read as empty: a result may be
        yield standard_input()
        return
    try:
        stream = open(source, "rb")  # noqa: SIM115  (closed below)
    except OSError as exc:
        raise CtxError(exc.errno or 5, f"cannot read {source}: {exc.strerror}") from None
    with stream:
        yield stream


def _holder(pid: int | None, worker: str | None) -> Holder:
    """The lease holder of a shell command: the calling process (our parent, past a wrapper
    such as ``timeout`` that waits for this very command) unless --pid."""
    if pid is None:
        pid = calling_process(sys.argv)
        if pid == 0:  # our parent lives in another pid namespace, where it has another pid
            raise usage_problem(
                invalid(
                    "the calling process is outside this pid namespace (a command entered "
                    "with nsenter or docker exec), so no lease can name it: pass --pid with "
                    "the pid, in this namespace, of the process that works on the job"
                )
            )
    try:
        return Holder.for_process(pid, worker)
    except CtxError as exc:
        raise usage_problem(exc) from None


@click.group(cls=LazyGroup, lazy={"work": "cortexfs.cli.work:work"})
def queue() -> None:
    """The crash-safe job queue of a project (shared/PROJECT/queue).

    Jobs move pending -> claimed (+ lease) -> done | failed.  Exit statuses:
    0 success, 1 refused or conflict found, 2 usage error, 3 nothing to claim; 130 after
    Ctrl-C, 141 when the reader of the output left ('| head -1'), 74 when the output cannot
    be written ('> /dev/full').
    """


@queue.command()
@handles_errors
@queue_options
def init(queue_dir: Path, as_json: bool) -> None:
    """Create the queue directories (inbox, pending, lease, claimed, done, failed).

    With --project, the queue is that of shared space PROJECT: a missing space is created
    whole, as 'ctx shared create' does (SPEC X-1: tool/, data/, queue/, agent/, setgid).
    """
    root = click.get_current_context().meta[STORAGE_ROOT_KEY]
    within = project_root(queue_dir)
    # What exists is checked as every other command checks it, before anything is made.
    layout.check_existing_queue(queue_dir, within=within)
    if within is not None:
        from cortexfs.shared.space_modes_check import space_modes_warning  # only init needs
        from cortexfs.shared.spaces import create_shared_space  # them

        created = create_shared_space(root, queue_dir.parent.name).created
        # What exists is kept as it is, and a mode it should have and lacks named.
        if (warning := space_modes_warning(queue_dir.parent)) is not None:
            echo_printable(f"ctx: warning: {warning}", err=True)
    else:
        # A queue directory anywhere else (--queue DIR, an absolute --project path) is only
        # a queue: a path that merely looks like X/shared/N/queue does not make X a root.
        created = layout.init_queue(queue_dir)
    made = f"{len(created)} {'entry' if len(created) == 1 else 'entries'} created"
    if created:
        changed(f"queue {queue_dir} was made ({made})")
    # Init creates what is missing and changes nothing that exists; a state directory that
    # lost its setgid bit is therefore named here, as status names it, not silently kept.
    with layout.Queue.open(queue_dir, within=within) as opened:
        for lost in inspect.state_dirs_not_giving_the_queue_group(opened):
            echo_printable(
                f"ctx: warning: {lost['path']}/ {lost['reason']}; {lost['remedy']}", err=True
            )
    if as_json:
        emit_json({"queue": str(queue_dir), "created": created})
        return
    echo_printable(f"queue {queue_dir} ready" + (f" ({made})" if created else ""))


@queue.command()
@handles_errors
@queue_options
@click.option("--name", help="Job name (the .req.json suffix is added when missing).")
@click.option("--batch", is_flag=True, help="FILE is JSONL: one request per line, one commit.")
@click.argument("source", required=False, metavar="(FILE | -)")
def publish(
    queue_dir: Path, as_json: bool, name: str | None, batch: bool, source: str | None
) -> None:
    """Publish a request (a JSON object with 'tool' and 'input') as a pending job.

    FILE, or - for stdin, holds the request; prints the job name.  With --batch every line of
    FILE is one request, published as a group commit (one barrier for the whole batch); one
    bad line refuses the whole batch, with nothing published.
    Refused with EEXIST when the name already has evidence anywhere in the queue.

    A publish that fails once jobs are in pending/ (a full disk that stops a batch midway)
    still prints the name of each job published (with --json: the error object's
    "published" list), then exits 1 naming the lines not published ("not_published_lines"):
    publish only those again.  So it does when stdout refuses the names (a full disk, a
    reader that left): the error on stderr then lists every job published.
    """
    if source is None:
        raise click.UsageError("give a request FILE, or - to read it from stdin")
    require_output("the name of the job published")
    if name is not None:
        if batch:
            raise click.UsageError("--name cannot be used with --batch")
        name = _job_argument(name)
    with _opened_input(source, "request") as stream, open_queue(queue_dir) as q:
        # The size limit is on the bytes given, which are stored as given: the file, or each
        # line of a batch (§2.1).  Nothing beyond it is read.
        limit = q.config.max_request_bytes
        if batch:
            parsed = parse_batch(stream, limit)
            # Ctrl-C while the batch is written cancels it; from its first move on, it waits
            # until the names are printed (see protocol.publish_batch).
            protocol.publish_batch(
                q,
                parsed.requests,
                given=parsed.lines,
                line_numbers=parsed.numbers,
                acknowledge=lambda jobs, refusal: _acknowledge_batch(jobs, refusal, as_json),
            )
        else:
            data = read_at_most(stream, limit, "request", "max_request_bytes")
            request = parse_request_bytes(data, limit)
            # Ctrl-C waits until the name is printed: a job published and never named would
            # be published again by whoever retries (see cortexfs.interrupts).
            with held_interrupts():
                try:
                    jobs = [protocol.publish(q, request, name, given=data)]
                except protocol.PublishedInPart as exc:
                    _published_in_part(exc, as_json)
                _acknowledge_published(jobs, batch, as_json)


def _acknowledge_published(jobs: list[str], batch: bool, as_json: bool) -> None:
    changed(f"{', '.join(jobs)} published and pending (do not publish again)")
    if as_json:
        emit_json({"names": jobs} if batch else {"name": jobs[0]})
        return
    for job in jobs:
        click.echo(job)


def _acknowledge_batch(
    jobs: list[str], refusal: protocol.PublishedInPart | None, as_json: bool
) -> None:
    if refusal is None:
        _acknowledge_published(jobs, True, as_json)
    else:
        _published_in_part(refusal, as_json)


def _published_in_part(refusal: protocol.PublishedInPart, as_json: bool) -> NoReturn:
    """End a publish that failed with jobs in pending/ (a batch cut short by a full disk): the
    jobs published are acknowledged as a success acknowledges them — each name on a line of
    its own on stdout; with --json, in the error object's ``published`` — and the error says
    which requests were not published.  Rendered here, while Ctrl-C is held, not after: a
    Ctrl-C would otherwise end the command without naming them, and a retry of the whole
    batch would publish them twice.

    The error always reaches stderr, and the exit status is always the refusal's (1), even
    when stdout refuses the names (``> /dev/full``, a file on the disk that stopped the batch,
    a reader that left): ending as an output failure (74, or 141 without a word) would read as
    a whole batch published, and the lines not published would never be published."""
    changed(refusal.outcome())
    if not as_json:
        try:
            for job in refusal.published:
                click.echo(job)
            sys.stdout.flush()  # the names before the error line, as a reader of both sees them
        except (OutputError, BrokenPipeError) as lost:
            discard_output(sys.stdout)
            refusal = protocol.PublishedInPart(
                refusal.errno,
                f"{refusal.message}; standard output refused the names published "
                f"({lost.strerror or lost}): this message is their one whole list",
                refusal.published,
                refusal.not_published,
                refusal.not_published_at,
            )
    fail(refusal, as_json=as_json)


@queue.command()
@handles_errors
@queue_options
@worker_id_option("Worker id recorded in the lease (default: HOST:PID).", "worker")
@click.option(
    "--pid",
    type=PID,
    help="Lease holder pid (default: the calling process, past a wrapper such as timeout or "
    "flock that waits for this command; inside an 'sh -c', a pipeline or { } group in $(...), "
    "or under setsid, pass --pid $$).",
)
@ttl_option("Lease lifetime in seconds (default: lease_ttl).")
def claim(
    queue_dir: Path, as_json: bool, worker: str | None, pid: int | None, ttl: float | None
) -> None:
    """Claim the oldest pending job and lease it; prints its name (exit 3 when none).

    The lease holder is the process that ran this command (its parent, e.g. your shell,
    past a timeout, flock, sudo, doas, runuser, su or time that waits for this command)
    unless --pid names another; recover requeues the job once that process is gone.
    """
    require_output("the name of the job claimed")
    holder = _holder(pid, worker)
    with open_queue(queue_dir) as q:
        # One process per claim: keep the claim order between processes.
        q.claim_order = HintedClaimOrder(q.path)
        # Ctrl-C waits until the claim is leased and named, or never made: stopped between
        # the two, a claim would be left without a lease, which no worker takes until the
        # queue is reconciled (see cortexfs.interrupts).
        left_pending: dict[str, str] = {}
        with held_interrupts():
            won = protocol.claim(q, holder, ttl, left_pending=left_pending)
            if won is not None:
                _require_unexpired(won.lease, ttl is not None)
                _acknowledge_claim(won, as_json)
    if won is not None and pid == os.getpid():
        _note_holder_is_this_command(won.lease, "claim")
    elif won is not None and pid is not None:
        # Taken as named (scripts use a gone pid to hand a job straight to recover), but a
        # mistyped --pid would otherwise make a lease that lasts until the next recover.
        _note_if_holder_gone(won.lease)
    if won is None:
        say_why_left_pending(left_pending)
        sys.exit(EXIT_NOTHING)  # §2.4: nothing on stdout, with or without --json


def _require_unexpired(lease: Lease, ttl_given: bool) -> None:
    """ETIMEDOUT, and J not named, when the lease just taken has expired already (a --ttl,
    or the queue's lease_ttl, shorter than the claim took): the caller would start on a job
    that recover, judging the expired lease the proof of its holder's death (Q-5), requeues
    to run again."""
    if time.time() >= lease.expires_at:
        longer = (
            "claim with a longer --ttl"
            if ttl_given
            else "give the claim a longer --ttl, or the queue a longer lease_ttl in its config"
        )
        period = round(lease.period, 6)  # as its stamps hold it: to the microsecond
        raise CtxError(
            errno.ETIMEDOUT,
            f"job {lease.job} was claimed, but its lease of {period:g} s expired before "
            f"the claim returned: do not run it; 'ctx queue recover' returns it to pending; "
            f"{longer}",
        )


def _note_holder_is_this_command(lease: Lease, verb: str) -> None:
    """The lease just taken or renewed names this very command's process (the shell ran it in
    its place, ``exec``), which ends as it returns."""
    _note(
        f"the lease holder is this command's own process (pid {lease.holder.pid}: the shell "
        f"ran it in its place), which ends now: 'ctx queue recover' will requeue {lease.job}; "
        f"{verb} from a shell that goes on working on the job"
    )


def _note_if_holder_gone(lease: Lease) -> None:
    """Say so when the holder a lease was just taken or renewed for is gone by Q-5's rules
    (not running here, a zombie, its pid another process's now, the lease expired already):
    the lease is gone with it, and the next recover requeues the job."""
    verdict = judge(lease)
    if verdict.gone:
        _note(
            f"{verdict.reason}, so its lease is already gone: 'ctx queue recover' requeues "
            f"{lease.job}"
        )


def _for_this_queue_printed(text: str) -> None:
    echo_printable(for_this_queue(text))


def _note(text: str) -> None:
    """A note on stderr, its suggested queue commands naming this command's queue."""
    echo_printable(for_this_queue(f"ctx: note: {text}"), err=True)


def say_why_left_pending(left_pending: dict[str, str]) -> None:
    """Jobs pending, as status counts them, yet not claimed: a note for each kind, so that
    an exit 3 over a queue that is not empty, or a drained worker leaving jobs pending, is
    explained (on stderr: claim's stdout stays empty, §2.4)."""
    unreadable = [job for job, why in left_pending.items() if why == protocol.UNREADABLE]
    if unreadable:
        _note(
            f"left pending, since uid {os.geteuid()} may not read their "
            f"request: {_some(unreadable)}; a member who may read them claims them"
        )
    unlinkable = [job for job, why in left_pending.items() if why == protocol.UNLINKABLE]
    if unlinkable:
        _note(
            f"left pending, since this queue moves requests by hard link (its filesystem has "
            f"no atomic rename, or its config says move=link) and the kernel lets uid "
            f"{os.geteuid()} link only a file it owns or may write (fs.protected_hardlinks): "
            f"{_some(unlinkable)}; their owner, or a member who may write them, claims them "
            "('ctx queue publish' makes a request writable by the queue's group)"
        )
    held = {
        protocol.CLAIM_LEFT: (
            "with claimed/J there already",
            "a claim in progress settles it in a moment; an empty claimed/J that a crash left "
            "is removed by 'ctx queue recover --reconcile'",
        ),
        protocol.LEASE_LEFT: (
            "with a lease/J and no claim",
            "'ctx queue recover --reconcile' removes that lease once its holder is gone",
        ),
        protocol.FINISHED: ("as J is in done/ or failed/ too, a conflict", _conflict_remedy),
        protocol.RECOVERED: (
            "as a 'ctx queue recover --reconcile' running meanwhile took each fresh claimed/J "
            "for a crash's leftover",
            "claim again once it is done",
        ),
    }
    for why, (evidence, remedy) in held.items():
        jobs = [job for job, reason in left_pending.items() if reason == why]
        if jobs:
            said = remedy(jobs) if callable(remedy) else remedy
            _note(f"left pending, {evidence}: {_some(jobs)}; {said}")


def _conflict_remedy(jobs: list[str]) -> str:
    """What to do about jobs both pending and finished: look at their evidence, with a
    command to copy that names the job itself when there is one."""
    show = f"'ctx queue show {jobs[0]}'" if len(jobs) == 1 else "'ctx queue show J' of each"
    return f"{show} lists its evidence; a conflict is never resolved for you"


def say_left_claimed(jobs: list[str]) -> None:
    """Jobs an aborted worker left claimed, their tools killed or never started: named, with
    what settles them (their leases name the worker, a process gone once it has exited)."""
    if jobs:
        _note(
            f"left claimed, as the worker was aborted before their tools ended: {_some(jobs)}; "
            "'ctx queue recover' requeues them once this worker has exited, and they run again"
        )


def _some(jobs: list[str], shown: int = 5) -> str:
    """The first names of a list that may be long (a queue of conflicts), and how many more."""
    more = len(jobs) - shown
    return ", ".join(jobs[:shown]) + (f" and {more} more" if more > 0 else "")


def _acknowledge_claim(won: protocol.Claim, as_json: bool) -> None:
    pid = won.lease.holder.pid
    claimed = (
        f"job {won.job} is claimed and leased to pid {pid} (finish it, or 'ctx queue recover' "
        f"requeues it once pid {pid} is gone)"
    )
    changed(claimed)
    try:
        if as_json:
            emit_json(won.to_json())
        else:
            click.echo(won.job)
    except BrokenPipeError:
        # Unlike a listing cut short by '| head -1', a claim whose name nobody read leaves a
        # job leased to a process that does not know it holds one: said on stderr, then the
        # quiet exit 141 of every command whose reader left.
        _note(f"the reader of standard output left before it read the job's name: {claimed}")
        raise
    if won.invalid_reason is not None:  # see docs/queue.md
        _note(
            f"the request of {won.job} is not valid ({won.invalid_reason}): "
            f"finish it with --error, as a worker does"
        )


@queue.command()
@handles_errors
@queue_options
@click.argument("job")
@click.option(
    "--pid",
    type=PID,
    help="Lease holder pid (default: the calling process, past a wrapper such as timeout or "
    "flock that waits for this command; inside an 'sh -c', a pipeline or { } group in $(...), "
    "or under setsid, pass --pid $$).",
)
@ttl_option(
    "New lifetime in seconds from now (default: as long as the lease was taken or last "
    "renewed for, so a renewal never shortens it)."
)
def renew(queue_dir: Path, as_json: bool, job: str, pid: int | None, ttl: float | None) -> None:
    """Extend the caller's own lease on JOB (EACCES when another process holds it)."""
    job = _job_argument(job)
    callers = [_holder(pid, None)]
    if pid is None:
        # The shell that claimed may have exec'd this command in its own process (bash
        # does so with the last command of 'bash -c "claim && renew"'): then it is us.
        callers.append(Holder.for_process(os.getpid(), None))
    # Ctrl-C waits until the renewal is made and said, or never made: no temp left in inbox/,
    # and no renewal made but unsaid (the EINTR line says that what was printed is done).
    with open_queue(queue_dir) as q, held_interrupts():
        try:
            lease = protocol.renew(q, job, callers, ttl)
        except protocol.NotHeld as refusal:
            if pid is None and refusal.errno == errno.EACCES:
                # A subshell or a background loop of the script that claimed is a process of
                # its own: it renews for the claiming shell by naming it.
                refusal.message += (
                    "; from another process than the one that claimed (a subshell, a "
                    "background loop), name the holder with --pid (in the claiming shell: "
                    "--pid $$)"
                )
            raise
        changed(f"the lease on {job} was renewed until {lease.to_json()['expires_at']}")
        if as_json:
            emit_json(lease.to_json())
        else:
            click.echo(f"{job} leased until {lease.to_json()['expires_at']}")
    if pid is None and lease.holder.is_same_process(callers[1]):
        _note_holder_is_this_command(lease, "renew")
    else:
        _note_if_holder_gone(lease)


@queue.command()
@handles_errors
@queue_options
@click.argument("job")
@click.option("--ok", "ok", is_flag=True, help="The job succeeded: move it to done/.")
@click.option("--error", "error", is_flag=True, help="The job failed: move it to failed/.")
@click.argument("result_source", required=False, metavar="[RESULT_FILE | -]")
def finish(
    queue_dir: Path, as_json: bool, job: str, ok: bool, error: bool, result_source: str | None
) -> None:
    """Finish a claimed JOB in done/ (--ok) or failed/ (--error).

    RESULT_FILE (or - for stdin) becomes the result's output: parsed as JSON when it is
    JSON, kept as text otherwise.  A whole result object as SPEC §2.1 shapes it
    ({"status": "ok"|"error", "output": ..., and at most worker, started, finished}) gives
    its output; its status must agree with --ok or --error.  The result's worker is the
    lease's holder (who claimed the job, with its --worker id), its start the lease's
    claimed_at, its finish now.  Returns only once the terminal pair is durable.
    """
    if ok == error:
        raise click.UsageError("say how the job ended: exactly one of --ok or --error")
    job = _job_argument(job)
    with open_queue(queue_dir) as q:
        output = _result_output(q, result_source, ok)
        # A finish stopped midway leaves a result beside a claimed request, for
        # 'recover --reconcile' to roll forward: Ctrl-C waits until it is complete and said.
        with held_interrupts():
            result = protocol.finish(q, job, ok, output)  # the worker: the lease's holder
            state = "done" if ok else "failed"
            changed(f"job {job} was finished in {state}/ (do not finish it again)")
            if as_json:
                emit_json({"name": job, "state": state, "result": result})
            else:
                click.echo(job)


def _result_output(q: layout.Queue, result_source: str | None, ok: bool) -> Any:
    """The output a shell's ``finish`` records: RESULT_FILE (or stdin) as JSON when it parses,
    as text otherwise; a whole result object gives its output (its status must agree)."""
    output: Any = None
    if result_source is not None:
        with _opened_input(result_source, "result") as stream:
            limit = q.config.max_result_bytes
            raw = read_at_most(stream, limit, "the result file", "max_result_bytes")
        try:
            output = loads_json(raw.decode("utf-8"))
        except NotAJsonNumber as exc:
            # It parses as JSON only by Python's leave: stored, the result would not be JSON.
            raise not_a_json_number("the result file", exc) from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            output = raw.decode("utf-8", "replace")
        if _is_whole_result(output):
            # Readers disagree on a name given twice (the first, the last): a status named
            # twice could say error to one reader of done/ and ok to another.
            named = Counter(name for name, _ in json.loads(raw.decode(), object_pairs_hook=list))
            twice = sorted(name for name, times in named.items() if times > 1)
            if twice:
                raise usage_problem(
                    invalid(
                        f"the result file names {', '.join(map(repr, twice))} more than once "
                        "in its top object; give each once (nothing was finished)"
                    )
                )
            if output["status"] != ("ok" if ok else "error"):
                raise usage_problem(
                    invalid(
                        f"the result file says status {output['status']!r}, but the job is "
                        f"finished with {'--ok' if ok else '--error'}"
                    )
                )
            output = output["output"]
    return output


@queue.command()
@handles_errors
@queue_options
def status(queue_dir: Path, as_json: bool) -> None:
    """Counts per state, ignored entries, incomplete pairs and conflicts.

    With --json, one object: {"queue": PATH, "pending": N, "claimed": N, "done": N,
    "failed": N, "conflict": N, "counts": {the same, and "incomplete" and "ignored"},
    "ignored": [...], "incomplete": [...], "conflicts": [...], "temps": [...],
    "owned_by_others": [...], "group_not_inherited": [...]}.  A state directory that belongs
    neither to the queue's owner nor to root is listed ('owner' lines, "owned_by_others"):
    its owner may rename it away with its jobs or lock everyone else out of it, whatever the
    queue's sticky bit.  In a queue shared by a group, a state directory that is not setgid
    with the queue's group is listed ('group' lines, "group_not_inherited"): what members
    make in it would not be the group's.
    Exit 1 when a conflict is found (SPEC §2.4), else 0.
    """
    with open_queue(queue_dir) as q:
        report = inspect.status(q)
        if not os.path.lexists(q.path / layout.CONFIG_NAME):
            # Its limits would pass for the ones set (a lowered max_request_bytes) otherwise.
            _note(
                f"{q.path / layout.CONFIG_NAME} is missing, so every limit is the default; "
                "'ctx queue init' writes the default config in its place"
            )
    found_conflict = EXIT_REFUSED if report.conflicts else EXIT_OK  # §2.4
    if as_json:
        emit_json(for_this_queue_in(report.to_json()))
        sys.exit(found_conflict)
    say = _for_this_queue_printed  # its suggestions name the queue this command was given
    say(f"queue: {report.path}")
    for state, count in report.counts.items():
        say(f"{state:<11}{count:>8}")
    for item in report.incomplete:
        say(f"incomplete {item['job']}: {item['detail']} (recover --reconcile: {item['repair']})")
    for item in report.conflicts:
        say(f"conflict   {item['job']}: {item['detail']}; evidence: {', '.join(item['evidence'])}")
    for entry in report.ignored:
        say(f"ignored    {entry.path}: {entry.reason}")
    for temp in report.temps:
        say(f"temp       {temp['path']} ({_temp_kind(temp)}{temp['age_seconds']:.0f}s old)")
    for owned in report.owned_by_others:
        say(f"owner      {owned['path']}/: {owned['reason']}; {owned['remedy']}")
    for lost in report.group_not_inherited:
        say(f"group      {lost['path']}/: {lost['reason']}; {lost['remedy']}")
    sys.exit(found_conflict)


def _temp_kind(temp: dict[str, Any]) -> str:
    """``symlink, `` for what was planted at a temp file's name; nothing for a temp file."""
    return "" if temp["kind"] == REGULAR_FILE else f"{temp['kind']}, "


@queue.command(name="list")
@handles_errors
@queue_options
@click.option(
    "--state",
    type=click.Choice(["pending", "claimed", "done", "failed", "incomplete", "conflict"]),
    help="Only jobs in this state (pending ones in the order your next claims take them).",
)
def list_command(queue_dir: Path, as_json: bool, state: str | None) -> None:
    """List jobs: one name per line with --state, else 'STATE NAME' lines.

    Exit 1 when a listed job is a conflict (SPEC §2.4), else 0.
    """
    with open_queue(queue_dir) as q:
        jobs = inspect.list_jobs(q, state)
    listed_conflict = any(job["state"] == "conflict" for job in jobs)
    if as_json:
        emit_json(jobs)
    else:
        for job in jobs:
            echo_printable(job["name"] if state else f"{job['state']:<11}{job['name']}")
    sys.exit(EXIT_REFUSED if listed_conflict else EXIT_OK)  # §2.4


@queue.command()
@handles_errors
@queue_options
@click.argument("job")
def show(queue_dir: Path, as_json: bool, job: str) -> None:
    """Every piece of evidence for JOB, with its request, lease and result.

    Exit 1 when JOB is a conflict (SPEC §2.4), or when the queue holds nothing at its name
    (ENOENT, naming 'ctx queue list'), else 0.
    """
    job = _job_argument(job)
    with open_queue(queue_dir) as q:
        detail = inspect.show(q, job)
    conflict = EXIT_REFUSED if detail["state"] == "conflict" else EXIT_OK  # §2.4
    if as_json:
        emit_json(detail)
        sys.exit(conflict)
    echo_printable(f"job:    {detail['name']}")
    echo_printable(f"state:  {detail['state']} ({detail['detail']})")
    if detail.get("repair"):
        echo_printable(f"repair: recover --reconcile would apply {detail['repair']}")
    rows = []
    for item in detail["evidence"]:
        mtime = item.get("mtime") or "a time beyond years 1 to 9999"
        extra = f"{item.get('size', '?')} bytes, {mtime}" if "size" in item else ""
        rows.append([item["path"], item["kind"], extra])
    for temp in detail["temps"]:
        kind = _temp_kind(temp) or "temp file, "
        rows.append([temp["path"], f"{kind}{temp['age_seconds']:.0f}s old"])
    for line in table(rows):
        echo_printable(f"  {line}")
    for key in ("request", "lease", "result"):
        if key in detail:
            echo_printable(f"{key}: {readable_json(detail[key])}")
    if "holder" in detail:
        holder = detail["holder"]
        echo_printable(f"holder: {holder['state']} ({holder['reason']})")
    sys.exit(conflict)


@queue.command()
@handles_errors
@queue_options
@click.option("--reconcile", is_flag=True, help="Also complete incomplete pairs (Q-6).")
@click.option("--dry-run", is_flag=True, help="Report what would be done; change nothing.")
@click.option(
    "--grace",
    type=Seconds(min=0),
    help="Minimum age in seconds of inbox temp files before they count as stray "
    "(default: grace in queue/config, 60).",
)
def recover(
    queue_dir: Path, as_json: bool, reconcile: bool, dry_run: bool, grace: float | None
) -> None:
    """Requeue claimed jobs whose lease holder is provably gone; report everything else.

    With --reconcile, also complete the incomplete pairs a crash leaves (a claim without a
    lease goes back to pending, a result with its request still claimed rolls forward,
    orphan claim/lease directories and stray temp files are removed).  Conflicts are only
    reported.  Jobs whose holder is alive are never touched, nor is a job another claim,
    finish or recover is moving at that moment (listed as untouched, counted as neither).
    Exit 0 when the queue is consistent afterwards, 1 when incomplete pairs or conflicts
    remain (stray temp files count as neither) or a job could not be handled: its 'error'
    line names the directory that refused (its mode, an immutable attribute, a read-only
    filesystem…), what to do, and where the job stands; --dry-run changes nothing, so it
    exits as the queue stands.
    """
    try:
        with open_queue(queue_dir) as q:
            report = recovery.recover(q, reconcile=reconcile, dry_run=dry_run, grace=grace)
    except recovery.Interrupted as stop:
        # Said before the EINTR line, which says that what was printed is done.
        if not as_json:
            _render_applied(stop.report)
        raise KeyboardInterrupt from None
    if not dry_run:
        changed("the queue was recovered (a second 'ctx queue recover' finds nothing more)")
    if as_json:
        emit_json(for_this_queue_in(report.to_json()))
    else:
        _render_recover(report)
    if not report.consistent:
        sys.exit(EXIT_REFUSED)


def _render_applied(report: recovery.RecoverReport) -> None:
    """The requeue and repair lines of ``report`` (with --dry-run, what would be done)."""
    verb = "would " if report.dry_run else ""
    say = _for_this_queue_printed
    for f in report.requeued:
        say(f"{verb}requeue  {f.job}: {f.detail}")
    for f in report.repaired:
        say(f"{verb}repair   {f.job}: {f.action}: {f.detail}")


def _render_recover(report: recovery.RecoverReport) -> None:
    dry = report.dry_run
    say = _for_this_queue_printed
    _render_applied(report)
    for f in report.untouched:
        say(f"untouched {f.job}: {f.detail}")
    for f in report.incomplete:
        hint = "" if report.reconcile else f" (run with --reconcile: {f.action})"
        say(f"incomplete {f.job}: {f.detail}{hint}")
    for f in report.conflicts:
        say(f"conflict {f.job}: {f.detail}; evidence: {', '.join(f.evidence)}")
    for path in report.removed_temps:
        echo_printable(f"remove   {path}")
    for path in report.stale_temps:
        if report.reconcile:  # only a dry run leaves them
            echo_printable(f"would remove {path}")
        else:
            echo_printable(f"stale    {path} (run with --reconcile to remove)")
    for entry in report.ignored:
        echo_printable(f"ignored  {entry.path}: {entry.reason}")
    for f in report.errors:
        say(f"error    {f.job}: {f.detail}")
    state = "consistent" if report.consistent else "NOT consistent"
    # Each untouched line says why: a holder alive or not provably gone (another host, pid
    # namespace), or a job another process was moving.
    alive = f" ({len(report.untouched)} untouched, as listed)" if report.untouched else ""
    # The stale temps count what is left; what this run removed is said apart.
    removed = f", {len(report.removed_temps)} temps removed" if report.removed_temps else ""
    failed = f", {len(report.errors)} errors" if report.errors else ""
    requeued, repaired = ("would requeue", "would repair") if dry else ("requeued", "repaired")
    echo_printable(
        f"{len(report.requeued)} {requeued}, {len(report.repaired)} {repaired}, "
        f"{len(report.incomplete)} incomplete, {len(report.conflicts)} conflicts, "
        f"{len(report.stale_temps)} stale temps{removed}{failed}: queue {state}"
        + (" (nothing changed: dry run)" if dry else "")
        + alive
    )
