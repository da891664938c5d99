"""``ctx queue work`` and the ready worker programs of workers/ (SPEC §3, W-5), thin over
:mod:`cortexfs.worker`.

Both are the same command line — one set of options with the same types and limits, the same
errors in the same form (``PROG: ERRNO: sentence``), the same exit statuses — and differ only
in what they fix: a ready program runs one kind of job, needs ``--agent``, and prints each
finished job as a JSON line.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from cortexfs.cli.columns import fitted
from cortexfs.cli.common import (
    changed,
    discard_output,
    echo_printable,
    fail,
    handles_errors,
    object_name_argument,
    suggestions_for_this_queue,
)
from cortexfs.cli.params import Integer, Seconds
from cortexfs.cli.queue import (
    STORAGE_ROOT_KEY,
    open_queue,
    project_root,
    queue_options,
    say_left_claimed,
    say_why_left_pending,
    ttl_option,
    worker_id_option,
)
from cortexfs.errors import CtxError
from cortexfs.printable import printable
from cortexfs.queue.holder import MIN_WORKER_LEASE_TTL, check_worker_ttl
from cortexfs.readiness import writable
from cortexfs.worker.stop_signals import EarlyStop

if TYPE_CHECKING:
    from cortexfs.worker.loop import WorkerSummary

F = TypeVar("F", bound=Callable[..., Any])

# Each job slot is a thread and each running job a process: beyond this many, threads and
# processes run out before jobs do.
MAX_CONCURRENCY = 1024

# What a ready program prints without --json: the jobs it finished (or lost) and its summary.
FINISHED_EVENTS = frozenset({"finish", "lost", "stop"})

# The field of each event that the worker words itself (a finished job's reason is its tool's):
# a 'ctx queue …' it suggests is made to name this worker's queue, in text and JSON alike.
_WORKERS_OWN_WORDS = {
    "lost": "reason",
    "renew_failed": "reason",
    "interrupt": "message",
    "stop": "failure",
}


class Progress:
    """What the worker shows: a live line on a terminal, plain lines otherwise, or JSON lines
    (of every event, or of the events in ``only``).

    Output that can no longer be written (the reader of a pipe left, a full disk) stops the
    worker as SIGTERM does: no more claims, running jobs are finished.  :attr:`lost_output`
    is then the error, for the command to end with once the worker stopped, and
    :meth:`what_was_done` what it should say the worker did.
    """

    def __init__(
        self,
        as_json: bool,
        on_lost_output: Callable[[], None],
        only: Collection[str] | None = None,
    ) -> None:
        self.as_json = as_json
        self.only = only
        # One line rewritten in place needs a terminal that moves its cursor (not TERM=dumb,
        # an editor's shell buffer); elsewhere each job gets its line.
        self.live = not as_json and sys.stderr.isatty() and os.environ.get("TERM", "dumb") != "dumb"
        self.done = self.failed = 0
        self.started = time.time()
        self.on_lost_output = on_lost_output
        self.for_this_queue = suggestions_for_this_queue()  # the job slots have no context
        self.lost_output: OSError | None = None
        self.finished = 0  # jobs finished, shown or not
        self.unshown: list[str] = []  # the finished jobs whose finish could not be shown
        # Reentrant: the main thread's signal handlers report too (an interrupt).
        self._lock = threading.RLock()
        # The worker's abort (a second ^C), which waits for no reader: set, an event is
        # dropped when another thread holds the output, or its stream takes nothing within a
        # second (see _turn, _echo).
        self.aborted = threading.Event()

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        # Called from every job slot's thread: one event's lines are written together.
        if not self._turn():
            return
        try:
            if event == "finish":
                self.finished += 1
            if self.lost_output is None:
                try:
                    self._show(event, fields)
                    return
                except OSError as exc:
                    self.lost_output = exc
                    self.on_lost_output()
            if event == "finish":
                self.unshown.append(f"{fields['job']} in {fields['state']}/")
        finally:
            self._lock.release()

    def _turn(self) -> bool:
        """Wait for the lock; False once the worker is aborted while another thread holds it
        (a job slot whose line waits for a reader that stopped reading)."""
        while not self._lock.acquire(timeout=0.1):
            if self.aborted.is_set():
                return False
        return True

    def what_was_done(self) -> str:
        """What the worker did, for a command whose output was lost: it stopped claiming, and
        which jobs it finished that its output could not show (none is to be run again)."""
        if not self.finished:
            return "the worker stopped claiming jobs; it finished no job"
        jobs = f"{self.finished} job" + ("" if self.finished == 1 else "s")
        done = f"the worker stopped claiming jobs; it finished {jobs}"
        return done + (f"; not shown: {', '.join(self.unshown)}" if self.unshown else "")

    def _echo(self, text: str, *, err: bool = False, nl: bool = True, control: str = "") -> None:
        """``text`` escaped (:func:`printable`: a job's reason quotes what its tool, request
        or publisher wrote), after the terminal ``control`` of a live line.  Once the worker
        is aborted, a stream that takes nothing within a second is not written: the line is
        dropped."""
        stream = sys.stderr if err else sys.stdout
        if self.aborted.is_set() and not _takes_output(stream):
            return
        try:
            click.echo(control + printable(text), nl=nl, err=err)
        except OSError:
            # What is still buffered for that stream can go nowhere either: drop it quietly.
            with contextlib.suppress(OSError, ValueError):
                discard_output(stream)
            raise

    def _show(self, event: str, fields: dict[str, Any]) -> None:
        advising = _WORKERS_OWN_WORDS.get(event)
        if advising is not None and isinstance(fields.get(advising), str):
            fields = {**fields, advising: self.for_this_queue(fields[advising])}
        if self.as_json:
            if self.only is None or event in self.only:
                self._echo(json.dumps({"event": event, **fields}, default=str))
            elif event == "renew_failed":  # a ready program's stdout is its finished jobs
                self._echo(f"renew   {fields['job']}: {fields['reason']}", err=True)
            return
        if event == "finish":
            if fields["state"] == "done":
                self.done += 1
            else:
                self.failed += 1
            if self.live:
                rate = (self.done + self.failed) / max(time.time() - self.started, 1e-9)
                line = f"done {self.done}  failed {self.failed}  {rate:.1f} jobs/s"
                # One row, however narrow the terminal: a wrapped line leaves its first rows
                # behind at each redraw, where \r and erase reach only the last.
                line = fitted(f"{line}  last: {fields['job']}", _columns_of(sys.stderr) - 1)
                self._echo(line, control="\r\033[K", nl=False, err=True)
            elif fields["state"] == "done":
                self._echo(f"done    {fields['job']} ({fields['seconds']:.3f}s)")
            else:
                self._echo(f"failed  {fields['job']}: {fields['reason']}")
        elif event in ("lost", "renew_failed"):
            if self.live:
                self._echo("", err=True)
            word = "lost" if event == "lost" else "renew"
            self._echo(f"{word:<8}{fields['job']}: {fields['reason']}", err=True)
        elif event == "start" and not self.live:
            self._echo(f"worker {fields['worker']} started (waiting with {fields['wait']})")
        elif event in ("interrupt", "stop"):
            if self.live:
                self._echo("", err=True)
            if event == "interrupt":
                self._echo(fields["message"], err=True)
            else:
                self._echo(
                    f"worker stopped: {fields['done']} done, {fields['failed']} failed, "
                    + (f"{fields['lost']} lost, " if fields["lost"] else "")
                    + f"{fields['rate']:.1f} jobs/s"
                    + (" (aborted)" if fields["aborted"] else "")
                )


def _takes_output(stream: Any) -> bool:
    """Whether ``stream`` can be written within a second (a pipe with room, a terminal, a
    file); True for one without a descriptor, whose write then says what it meets."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return True
    return bool(writable([fd], 1.0))


def _columns_of(stream: Any) -> int:
    """How many columns the terminal of ``stream`` has now (80 when it cannot say)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


def worker_options(fn: F) -> F:
    """The options of every worker command line, ``ctx queue work`` and the ready programs:
    one definition, so that both accept and refuse the same values (a usage error, exit 2,
    before any job is claimed)."""
    options = (
        click.option(
            "--session", default="worker", show_default=True, help="Session recording the jobs."
        ),
        click.option("--drain", is_flag=True, help="Exit as soon as the queue is empty."),
        click.option("--max-jobs", type=Integer(min=1), help="Exit after claiming N jobs."),
        click.option(
            "--concurrency",
            type=Integer(1, MAX_CONCURRENCY),
            default=1,
            show_default=True,
            help=f"Jobs at once (at most {MAX_CONCURRENCY}); each runs its tool in a process of "
            "its own.",
        ),
        click.option(
            "--timeout",
            type=Seconds(min=0, min_open=True),
            default=300.0,
            show_default=True,
            help="Per-job timeout in seconds; the tool's process group is killed after it.",
        ),
        ttl_option(
            "Lease lifetime in seconds, at least 1 (default: the queue's lease_ttl); renewed "
            "every third of it while a job runs.",
            check_worker_ttl,
            least=MIN_WORKER_LEASE_TTL,
        ),
        worker_id_option("Worker id recorded in leases (default: HOST:PID)."),
    )
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.command()
@handles_errors
@queue_options
@click.option(
    "--agent",
    envvar="CTX_AGENT",
    help="Run every job's tool as this agent, its identity and policy (W-1; default: "
    "$CTX_AGENT, unless empty).  Without one, every job claimed is finished in failed/ with "
    "EACCES.",
)
@click.option(
    "--kind",
    type=click.Choice(["tool", "shell"]),
    default="tool",
    show_default=True,
    help="tool: run any requested tool; shell: only shell.exec jobs.",
)
@worker_options
def work(queue_dir: Path, as_json: bool, agent: str | None, kind: str, **worker: Any) -> None:
    """Claim jobs and run their tools as AGENT until stopped (or the queue is empty, --drain).

    Without --agent (or $CTX_AGENT; an empty one is unset) the worker has no agent
    identity: it warns once on stderr, and every job it claims is refused (EACCES) and
    finished in failed/ with the reason.  An empty --agent '' is an illegal name: EINVAL,
    exit 2, nothing claimed.

    Each job's tool runs with its input through the full authorization chain, under the
    agent's identity, bounded by --timeout; the job is finished in done/ or failed/ with the
    output, exit status and, when denied, the denying step.  While waiting for work the
    worker sleeps on an inotify watch of pending/ (re-checking at least every 2 s).

    SIGTERM, SIGHUP or ^C: stop claiming, let running jobs finish, exit 0 (SIGTERM or SIGHUP
    while the worker starts: it says so on stderr and claims nothing).  ^C twice: abort
    running jobs (recover requeues them) and exit 130.  An error in a job slot that is not a
    job's failure stops the worker the same way, and it exits 1 naming the error with its
    errno (ENOSPC, EROFS, EMFILE…; EIO for an unexpected one); a job whose tool the host could
    not start for want of descriptors, memory or space, or whose call could not be recorded,
    stays claimed for recover.  A lease the host will not renew stops the worker too, and its
    job's tool is killed before the lease expires (the job stays claimed for recover).

    With --json, each event (claim, finish, stop, ...) is one JSON object on its own line of
    stdout (JSON Lines), as it happens.  Output that cannot be written stops the worker the
    same way: a full disk (> /dev/full) exits 74, 'ctx: ENOSPC: cannot write standard output
    (...)' naming the jobs it finished and could not show; a reader that left, 141.
    """
    # First, before the worker's modules load: a SIGTERM from now on stops it with a word.
    early_stop = EarlyStop.catch()
    from cortexfs.worker.executors import NO_AGENT

    # An empty $CTX_AGENT is unset, as shells commonly mean it (click reads it so); an empty
    # --agent '' is an illegal name, refused by _run like --agent 'a/b': a script whose
    # "$AGENT" is unset must not start a worker that fails every job.
    if agent is None:
        echo_printable(f"ctx: warning: {NO_AGENT}; every job claimed fails with EACCES", err=True)
    _run(queue_dir, kind, agent, early_stop, as_json=as_json, **worker)


def ready_worker(kind: str, description: str) -> click.Command:
    """The command line of a ready program of workers/: ``ctx queue work --kind KIND`` with
    ``--agent`` required, printing each finished job as one JSON line (every event with
    ``--json``)."""

    @click.command(
        help=_verbatim_examples(description),
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    @handles_errors
    @queue_options
    @click.option(
        "--agent", required=True, metavar="AGENT", help="Run every job's tool as this agent."
    )
    @worker_options
    def ready(queue_dir: Path, as_json: bool, agent: str, **worker: Any) -> None:
        early_stop = EarlyStop.catch()
        _run(
            queue_dir,
            kind,
            agent,
            early_stop,
            as_json=True,
            only=None if as_json else FINISHED_EVENTS,
            **worker,
        )

    return ready


def run_ready_worker(kind: str, description: str) -> NoReturn:
    """Run the ready program of ``kind`` on this process's arguments, and exit."""
    from cortexfs.cli.usage import run_click
    from cortexfs.standard_streams import prepare_standard_streams

    prepare_standard_streams()
    run_click(ready_worker(kind, description), sys.argv[1:], os.path.basename(sys.argv[0]))


def _verbatim_examples(description: str) -> str:
    """A program's docstring as click help: indented paragraphs (command examples) are kept
    as written instead of being rewrapped."""
    paragraphs = inspect.cleandoc(description).split("\n\n")
    return "\n\n".join(f"\b\n{p}" if p.startswith(" ") else p for p in paragraphs)


def _run(
    queue_dir: Path,
    kind: str,
    agent: str | None,
    early_stop: EarlyStop,
    *,
    as_json: bool,
    only: Collection[str] | None = None,
    session: str,
    drain: bool,
    max_jobs: int | None,
    concurrency: int,
    timeout: float,
    ttl: float | None,
    worker_id: str | None,
) -> None:
    """Check the names, run the worker on ``queue_dir`` (its events shown as JSON lines, those
    in ``only`` when given, or as text) and end as its summary says.

    A stop signal that ``early_stop`` noted while the worker started stops it before its
    first claim: one line on stderr, the summary of a worker that claimed nothing, exit 0.
    """
    from cortexfs.worker.executors import executor_for
    from cortexfs.worker.loop import EXIT_ABORTED, Worker, WorkerOptions, check_workable

    root = click.get_current_context().meta[STORAGE_ROOT_KEY]
    # A malformed name is a malformed command line (exit 2), found before any job is claimed.
    session = object_name_argument(session, "session")
    if agent is not None:
        agent = object_name_argument(agent, "agent")
    options = WorkerOptions(
        drain=drain,
        max_jobs=max_jobs,
        concurrency=concurrency,
        lease_ttl=ttl,
        job_timeout=timeout,
        worker_id=worker_id,
    )
    # Refused as by every other command (a project's queue reached through a symlink, ELOOP;
    # a queue that is not one), and for what no worker can work (a directory pinned by its
    # attribute, a lease_ttl too short), before the worker's session is made.
    with open_queue(queue_dir) as queue:
        check_workable(queue, options)
    if early_stop.stopped_by is not None:
        # Stopped before its session is opened: nothing of the agent's home is made.
        _stopped_while_starting(early_stop.stopped_by, Progress(as_json, lambda: None, only))
        return
    executor = executor_for(kind, root, agent, session, queue_dir)
    progress = Progress(as_json, lambda: worker.stop("output closed"), only)
    worker = Worker(
        queue_dir, executor, options, progress, within=project_root(queue_dir), root=root
    )
    progress.aborted = worker.abort
    worker.install_signal_handlers()
    # Read only now that the worker's handlers take the signals: none noted is lost between.
    if early_stop.stopped_by is not None:
        executor.close()
        _stopped_while_starting(early_stop.stopped_by, progress)
        return
    try:
        summary = worker.run()
    finally:
        executor.close()
    if worker.reports_abandoned:
        _end_without_waiting(progress, summary, EXIT_ABORTED)
    _end(progress, summary)
    if summary.aborted:
        sys.exit(EXIT_ABORTED)


def _end_without_waiting(progress: Progress, summary: WorkerSummary, aborted: int) -> NoReturn:
    """End an aborted worker whose job slots still wait for a reader to take their lines:
    they hold standard output's buffer, and the interpreter's exit would wait for them, then
    for that buffer.  Standard error says what :func:`_end` says, unless it takes nothing
    either (``2>&1 | less``); the exit is at once, with the status :func:`_end` gives (130,
    or a failure's that stopped the worker first)."""
    status = aborted
    if _takes_output(sys.stderr):
        try:
            _end(progress, summary)
        except CtxError as error:
            try:
                fail(error)  # its line on stderr only: stdout is what waits for a reader
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else 1
        except OSError:
            pass  # the output was lost before the abort: nothing more can be said on it
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
    os._exit(status)


def _stopped_while_starting(signal_name: str, progress: Progress) -> None:
    """End a worker that a stop signal stopped before its first claim: one line on stderr,
    then its summary (``stop``, the last event of every stopped worker), exit 0."""
    from cortexfs.worker.loop import WorkerSummary

    program = click.get_current_context().find_root().info_name or "ctx"
    echo_printable(
        f"{program}: stopped by {signal_name} while starting; no job was claimed", err=True
    )
    summary = WorkerSummary(stopped_by=signal_name)
    progress("stop", summary.to_json())
    _end(progress, summary)


def _end(progress: Progress, summary: WorkerSummary) -> None:
    """End as a worker's summary says: 74 or 141 when its output was lost, 1 naming the
    error that stopped a job slot; return for a worker that stopped as asked."""
    lost = progress.lost_output
    say_why_left_pending(summary.left_pending)  # a drained queue that is not empty
    if summary.aborted:  # a failure's own error names the job it left claimed
        say_left_claimed(summary.left_claimed)
    if lost is not None:
        # Ended as every command whose output failed: 74 saying what was done (141 quietly
        # when the reader left).
        changed(progress.what_was_done())
        raise lost
    if summary.failure is not None:
        if summary.failure_errno is None:
            raise CtxError(
                errno.EIO,
                f"the worker stopped on an unexpected error in a job slot ({summary.failure}); "
                "a job it was claiming may stay claimed: run 'ctx queue recover'",
            )
        # The failure says what became of its job (lost, or left claimed for recover).
        raise CtxError(
            summary.failure_errno, f"the worker stopped: {summary.failure.partition(': ')[2]}"
        )
