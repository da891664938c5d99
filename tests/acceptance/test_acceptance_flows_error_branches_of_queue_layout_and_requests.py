"""The error branches of a queue's layout, its config and the requests it takes, each reached
from outside through ``ctx queue init`` and ``ctx queue publish`` (SPEC §2, §2.1, Q-1, Q-2,
Q-8, Q-9, R-3, X-1, §2.4; docs/queue.md "Layout and states", "A queue shared by a group",
"The steps, and why each sync is there" (publish, ``publish --batch``), "What is not a job",
"Configuration", "Command line"; ``ctx queue init --help``, ``ctx queue publish --help``).

The angle: how a queue is opened and made, and what it takes in — ``queue/config`` damaged
in the ways an editor or a copy damages it (a directory in its place, a NUL, a byte that is
not UTF-8, a file saved as UTF-16 or with old Mac line ends); a state directory replaced by
a FIFO or a socket, closed to a member, or one of too many to open under ``ulimit -n``; a
space that is a regular file; ``init`` of a private queue (``--queue DIR``) that cannot make
what is missing (a member's, an immutable directory, a read-only bind mount, a full tmpfs)
and the stray temps of its config; ``publish`` into an immutable ``pending/``, on a disk that
fills in the middle of a batch, and while ``recover --reconcile`` or a person acts between
its steps (staging file removed, the name finished or put in ``pending/`` by hand); and
requests with every field wrong at once, a ``created`` that is no string, tool names at the
limits of R-3, a batch whose every line is refused for the size it would be stored at.

Each check reads the exit status of §2.4, the errno word of the ``ctx: ERRNO: sentence`` line
and of the ``--json`` error object, that the message names the file, directory or line at
fault and the remedy the documents promise, and that nothing is half-done: the queue byte for
byte as it was, no staging or config temp left, nothing followed through a link, no job lost
or published twice.  Where a message names a repair (move the config aside, ``chattr -i``,
publish those lines again), the repair is run and the queue looked at again."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    age,
    clean_env,
    ctx_run,
    limited,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute
from tests.support.strace import can_inject
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
STATE_DIRS = ("inbox", "pending", "lease", "claimed", "done", "failed")
GOOD = '{"tool":"fs.read","input":{"path":"README.md"}}'
TRACEBACK = "Traceback"
CONFIG_TEMP = re.compile(r"\.config\.[0-9a-f]{12}\.tmp")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr, mounts, uids)")
needs_strace = pytest.mark.skipif(not can_inject(), reason="needs strace fault injection")
# How long a traced publish is held at the step a test acts beside: long enough for the
# test's own command (a recover, a file put in place) to run in between.
STALL_MICROSECONDS = 8_000_000


# ----------------------------------------------------------------------------------- helpers


def no_traceback(r: Run) -> None:
    assert TRACEBACK not in r.err and TRACEBACK not in r.out, r


def refused(r: Run, word: str, rc: int = 1) -> str:
    """``r``, run with ``--json``, exited ``rc`` with one error object on stdout whose errno
    is ``word``, and the same error as the last line of stderr; its message."""
    no_traceback(r)
    assert r.rc == rc, r
    lines = r.out.splitlines()
    assert len(lines) == 1, r
    error = json.loads(lines[0])
    assert (error["error"], error["errno"]) == (word, getattr(errno, word)), r
    assert r.err.rstrip("\n").splitlines()[-1] == f"ctx: {word}: {error['message']}", r
    return error["message"]


def said(r: Run, word: str, rc: int = 1) -> str:
    """``r``, run without ``--json``, exited ``rc`` with ``ctx: WORD: …`` as its last line of
    stderr; the sentence after the errno word."""
    no_traceback(r)
    assert r.rc == rc, r
    last = r.err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"ctx: {word}: "), r
    return last.removeprefix(f"ctx: {word}: ")


def config_temps(queue_dir: Path) -> list[str]:
    """The temps of ``config`` an init left in ``queue_dir``, if it can be listed."""
    if not queue_dir.is_dir():
        return []
    return sorted(name for name in os.listdir(queue_dir) if CONFIG_TEMP.fullmatch(name))


def q_ctx(queue_dir: Path, verb: str, *args: str, **kw) -> Run:
    """``ctx queue VERB --queue QUEUE_DIR ARGS`` as root."""
    return ctx_run("queue", verb, "--queue", queue_dir, *args, **kw)


def as_member(user: UnprivilegedUser, home: Path, *args: str | Path) -> Run:
    """``ctx ARGS`` run as ``user`` (its own groups only), with ``home`` as its home."""
    env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))
    done = run_as(user, [*CTX_ARGV, *map(str, args)], env=env, cwd=home, stdin="")
    return Run([str(a) for a in args], done.returncode, done.stdout, done.stderr)


def fill(directory: Path) -> Path:
    """A file in ``directory`` grown until its filesystem has no byte left."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


def jsonl(*requests: str) -> str:
    return "".join(f"{line}\n" for line in requests)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this test's own that every uid may search."""
    made = new_scratch_dir(SCRATCH)
    yield made
    subprocess.run(["chattr", "-R", "-i", "-a", str(made)], capture_output=True)
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def disks() -> Iterator[ScratchMounts]:
    """Filesystems a test mounts below a scratch directory of its own, unmounted after."""
    mounts = ScratchMounts(new_scratch_dir(SCRATCH, "disks"))
    yield mounts
    mounts.close()


# ---------------------------------------------------------------------------- queue/config


def test_a_config_that_is_a_directory_is_refused_everywhere_until_moved_aside_as_told(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "Configuration" (the config is a data file of key=value lines, read whole
    by every command that opens the queue) and "Command line" (init calls no queue ready that
    another command refuses): a directory at ``config`` is neither read as an empty config
    nor replaced.  ``publish``, ``publish --batch``, ``status`` and ``init`` are each EINVAL,
    exit 1, naming ``Q/config`` and what it is, and the remedy: move it aside, and ``ctx
    queue init`` for this queue writes the default config in its place.  Nothing changes;
    the remedy followed, init writes the default and a publish goes through."""
    config = queue.dir / "config"
    config.unlink()
    config.mkdir()
    (config / "max_request_bytes").write_text("1\n")
    before = snapshot(queue.dir)
    expected = (
        f"{config} is a directory, not a regular file; move it aside, and 'ctx queue init "
        "--project proj' writes the default config in its place"
    )
    for argv, given in (
        (("publish", "-"), GOOD),
        (("publish", "--batch", "-"), jsonl(GOOD, GOOD)),
        (("status",), ""),
        (("init",), ""),
    ):
        r = queue.run(argv[0], *argv[1:], "--json", input=given)
        assert refused(r, "EINVAL") == expected, (argv, r)
        assert snapshot(queue.dir) == before, argv

    config.rename(queue.dir.parent / "config.aside")
    made = queue.run("init", "--json")
    assert made.rc == 0 and made.json()["created"] == [str(config)], made
    assert "max_request_bytes=1048576\n" in config.read_text()
    assert (queue.dir.parent / "config.aside" / "max_request_bytes").read_text() == "1\n"
    assert queue.run("publish", "-", input=GOOD).rc == 0


DAMAGED_CONFIGS = [
    pytest.param(b"max_request_bytes=10\x00\n", 1, "max_request_bytes must be", id="nul-value"),
    pytest.param(b"# fine\nlease_ttl\xff=30\n", 2, "unknown key", id="key-not-utf8"),
    pytest.param("max_request_bytes=100\n".encode("utf-16"), 1, "unknown key", id="utf-16"),
    pytest.param(
        b"max_request_bytes=100\rlease_ttl=30\r",
        1,
        "max_request_bytes must be",
        id="old-mac-line-ends",
    ),
    pytest.param(b"grace=5\n\x00\x00\x00\n", 2, "expected key=value", id="nul-only-line"),
]


@pytest.mark.parametrize(("data", "line", "words"), DAMAGED_CONFIGS)
def test_damaged_config_bytes_are_refused_naming_the_line_and_quoted_printably(
    queue: QueueCLI, data: bytes, line: int, words: str
) -> None:
    """docs/queue.md "Configuration" (unknown keys refused with EINVAL and the line number;
    a value past its rule refused naming file, line and key): a config holding a NUL, a byte
    that is not UTF-8, saved as UTF-16 or with old Mac line ends (one line for the whole
    file, as a line ends at "\\n") is refused by ``publish`` and ``status`` alike, EINVAL, exit
    1, naming ``Q/config:LINE``.  What it quotes is printable: no NUL or carriage return of
    the file reaches the terminal.  Nothing is published and nothing changes."""
    config = queue.dir / "config"
    config.write_bytes(data)
    before = snapshot(queue.dir)
    for argv, given in ((("publish", "-"), GOOD), (("status",), "")):
        r = queue.run(argv[0], *argv[1:], "--json", input=given)
        message = refused(r, "EINVAL")
        assert message.startswith(f"{config}:{line}: ") and words in message, (argv, r)
        assert all(ch.isprintable() for ch in message), repr(message)
        assert "\x00" not in r.err + r.out and "\r" not in r.err + r.out, r
        assert snapshot(queue.dir) == before


# ----------------------------------------------------------- state directories, the queue


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_state_directory_that_is_a_fifo_or_socket_is_refused_and_init_makes_nothing(
    queue: QueueCLI, kind: str
) -> None:
    """Q-8, docs/queue.md "Command line" (init refuses a state directory that is not a real
    one before anything is made; the only repair it makes is what is missing): ``done`` a
    FIFO or a socket, ``failed/`` missing.  ``init``, ``publish --batch`` and ``status`` are
    each ENOTDIR, exit 1, "Q/done is not a real directory; refusing to use it"; nobody blocks
    on the FIFO, init does not make ``failed/``.  The file removed, init makes both."""
    done, failed = queue.dir / "done", queue.dir / "failed"
    done.rmdir()
    failed.rmdir()
    bound = None
    if kind == "fifo":
        os.mkfifo(done)
    else:
        bound = socket.socket(socket.AF_UNIX)
        bound.bind(str(done))
    try:
        before = snapshot(queue.dir)
        for argv, given in (
            (("init",), ""),
            (("publish", "--batch", "-"), jsonl(GOOD)),
            (("status",), ""),
        ):
            r = queue.run(argv[0], *argv[1:], "--json", input=given, timeout=30)
            assert refused(r, "ENOTDIR") == f"{done} is not a real directory; refusing to use it"
            assert snapshot(queue.dir) == before and not failed.exists(), argv
    finally:
        if bound is not None:
            bound.close()
    done.unlink()
    made = queue.run("init", "--json")
    assert made.rc == 0 and sorted(made.json()["created"]) == [str(done), str(failed)], made
    assert queue.run("status").rc == 0


@needs_root
def test_a_state_directory_a_member_may_not_list_is_named_with_its_owner_and_mode(
    scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/queue.md "A queue shared by a group": a state directory the user may not open is
    refused naming the directory, its owner, group and mode, and what to do (EACCES, exit 1);
    ``pending/`` of root's private queue made 0700: the member's ``status``, ``publish`` and
    ``claim`` each say "may not read Q/pending (owner uid 0, group 0, mode 0700)", and nothing
    changes.  Given the queue, the member publishes."""
    q = scratch / "q"
    assert q_ctx(q, "init").rc == 0
    (q / "pending").chmod(0o700)
    before = snapshot(q)
    uid = unprivileged_user.uid
    for argv in (("status",), ("publish", "-"), ("claim", "--pid", "1")):
        r = as_member(
            unprivileged_user, scratch, "queue", *argv[:1], "--queue", q, *argv[1:], "--json"
        )
        message = refused(r, "EACCES")
        assert message.startswith(
            f"cannot open queue {q}: uid {uid} may not read {q}/pending (owner uid 0, group 0, "
            "mode 0700); run it as root or as that owner"
        ), (argv, r)
        assert snapshot(q) == before, argv
    subprocess.run(["chown", "-R", f"{uid}:{unprivileged_user.gid}", str(q)], check=True)
    (scratch / "req.json").write_text(GOOD)
    (scratch / "req.json").chmod(0o644)
    r = as_member(
        unprivileged_user,
        scratch,
        "queue",
        "publish",
        "--queue",
        q,
        "--name",
        "m",
        str(scratch / "req.json"),
    )
    assert (r.rc, r.out) == (0, "m.req.json\n"), r


def test_too_few_descriptors_to_open_the_queue_name_each_entry_refused(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "A queue shared by a group" (a step refused for want of a resource —
    EMFILE — keeps its errno, and is never bare: names what refused, what ran short, what was
    done and what to do): ``publish`` under ``ulimit -n`` from 5 up.  Each limit that stops it
    is EMFILE, exit 1, naming the queue and the one entry it could not open (a state
    directory, then the config), "nothing in it was changed", and ``ulimit -n``; the queue
    is untouched by each.  The first limit that lets it through publishes exactly one job."""
    env = clean_env(CTX_STORAGE=str(queue.storage))
    before = snapshot(queue.dir)
    entries = "|".join((*STATE_DIRS, "config"))
    pattern = re.compile(
        rf"cannot open queue {re.escape(str(queue.dir))}: {re.escape(str(queue.dir))}/"
        rf"({entries}) refused: Too many open files \(this process has no file descriptor "
        r"left\); nothing in it was changed: raise the limit of open files \('ulimit -n'\), "
        r"then run the command again"
    )
    named: list[str] = []
    for nofile in range(5, 40):
        r = limited(
            env, "queue", "publish", "--project", "proj", "--json", "-", input=GOOD, nofile=nofile
        )
        if r.rc == 0:
            break
        match = pattern.fullmatch(refused(r, "EMFILE"))
        assert match, (nofile, r)
        named.append(match[1])
        assert snapshot(queue.dir) == before, nofile
    else:
        pytest.fail("no limit of open files let the publish through")
    assert named[-1] == "config" and len(set(named)) >= 5, named
    assert len(os.listdir(queue.dir / "pending")) == 1
    assert os.listdir(queue.dir / "inbox") == []


def test_a_space_that_is_a_regular_file_refuses_every_queue_command_and_stays_as_it_is(
    storage: Path,
) -> None:
    """Q-8, X-1, docs/queue.md "Command line" (``init --project P`` makes the whole space
    when it is missing; nothing planted is followed, replaced or removed): ``shared/team`` a
    regular file.  ``init``, ``publish`` and ``status`` are ENOTDIR, exit 1, naming
    ``shared/team``; the file keeps its bytes and nothing is made beside it."""
    team = storage / "shared" / "team"
    team.write_text("notes\n")
    before = snapshot(storage / "shared")
    env = clean_env(CTX_STORAGE=str(storage))
    for argv, given in ((("init",), ""), (("publish", "-"), GOOD), (("status",), "")):
        r = ctx_run(
            "queue", argv[0], "--project", "team", *argv[1:], "--json", input=given, env=env
        )
        assert str(team) in refused(r, "ENOTDIR"), (argv, r)
        assert snapshot(storage / "shared") == before, argv


def test_init_of_a_space_that_is_a_regular_file_says_what_shared_create_says(
    storage: Path,
) -> None:
    """X-1, docs/queue.md "Command line" (``init --project P`` makes the whole shared space
    P when it is missing, as ``ctx shared create`` does): over a regular file at
    ``shared/team`` the two refuse alike, ENOTDIR naming the file "in the way", with the
    remedy (move it aside) and that nothing was changed."""
    team = storage / "shared" / "team"
    team.write_text("notes\n")
    env = clean_env(CTX_STORAGE=str(storage))
    created = ctx_run("shared", "create", "team", "--json", env=env)
    made = ctx_run("queue", "init", "--project", "team", "--json", env=env)
    assert "move it aside" in refused(created, "ENOTDIR")
    message = refused(made, "ENOTDIR")
    assert str(team) in message and "move it aside" in message, made
    assert "nothing was changed" in message, made


# --------------------------------------------------------------------------------- init


def test_init_removes_only_the_old_regular_temps_of_its_config(scratch: Path) -> None:
    """docs/queue.md "Command line" (init's only repair is what is missing; nothing planted is
    followed, replaced or removed), Q-8: the temps an init killed before its rename left
    beside ``config`` (``.config.<12 hex>.tmp``, a regular file older than a minute) are
    removed by the next init; a young one (another init's, still being written), a symlink or
    a directory at such a name, and names of another shape are left, and the file a link
    leads to keeps its bytes."""
    q = scratch / "q"
    assert q_ctx(q, "init").rc == 0
    target = scratch / "precious"
    target.write_text("keep\n")
    old = q / ".config.0123456789ab.tmp"
    young = q / ".config.aaaaaaaaaaaa.tmp"
    link = q / ".config.bbbbbbbbbbbb.tmp"
    directory = q / ".config.cccccccccccc.tmp"
    upper = q / ".config.ABCDEF012345.tmp"
    plain = q / "config.0123456789ab.tmp"
    for path in (old, young, upper, plain):
        path.write_text("max_request_bytes=1\n")
    link.symlink_to(target)
    directory.mkdir()
    for path in (old, link, directory, upper, plain):
        age(path, 7200)
    r = q_ctx(q, "init", "--json")
    assert r.rc == 0 and r.json()["created"] == [], r
    assert not old.exists()
    assert all(p.exists() or p.is_symlink() for p in (young, link, directory, upper, plain))
    assert os.readlink(link) == str(target) and target.read_text() == "keep\n"
    assert q_ctx(q, "status").rc == 0


@dataclass
class Cut:
    """A private queue whose init cannot make what is missing: the queue, the directory the
    refusal should name, who runs init, the errno, what the message must hold (the
    documented remedy), and how the cause is lifted."""

    queue: Path
    refusing: Path
    member: bool
    word: str
    remedy: str
    lift: Callable[[], object]


def _cut(kind: str, scratch: Path, disks: ScratchMounts) -> Cut:
    if kind == "full-config":
        disk = disks.tmpfs("full", "size=1m,mode=0755")
        q = disk / "q"
        assert q_ctx(q, "init").rc == 0
        (q / "config").unlink()
        filler = fill(disk)
        return Cut(q, q, False, "ENOSPC", "bytes and", filler.unlink)
    q = scratch / "q"
    if kind == "member-parents":
        q = scratch / "made" / "by" / "init" / "q"
        return Cut(q, scratch, True, "EACCES", "owner uid 0", lambda: None)
    assert q_ctx(q, "init").rc == 0
    if kind in ("member-config", "immutable-config"):
        (q / "config").unlink()
    else:
        (q / ("done" if kind == "member-state-dir" else "lease")).rmdir()
    if kind.startswith("member"):
        return Cut(q, q, True, "EACCES", "owner uid 0", lambda: None)
    if kind == "immutable-config":
        made = subprocess.run(["chattr", "+i", str(q)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
        lifted = ["chattr", "-i", str(q)]
        return Cut(q, q, False, "EPERM", f"chattr -i {q}", lambda: subprocess.run(lifted))
    disks.bind_self(q, "ro")
    return Cut(q, q, False, "EROFS", "read-only", lambda: disks.unmount(q))


CUTS = [
    "member-config",
    "member-state-dir",
    "member-parents",
    "immutable-config",
    "read-only-state-dir",
    "full-config",
]


def _init(cut: Cut, user: UnprivilegedUser, home: Path) -> Run:
    if cut.member:
        return as_member(user, home, "queue", "init", "--queue", cut.queue, "--json")
    return q_ctx(cut.queue, "init", "--json")


@needs_root
@pytest.mark.parametrize("kind", CUTS)
def test_init_of_a_private_queue_it_cannot_complete_leaves_nothing_and_completes_later(
    kind: str, scratch: Path, disks: ScratchMounts, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/queue.md "Command line" (init makes what is missing, and only that), "A queue
    shared by a group" (nothing is left half-done; a step refused by a mode is EACCES, by an
    attribute EPERM, by a read-only filesystem EROFS, for want of space ENOSPC): ``init
    --queue DIR`` that may not make the missing config, state directory or parents is
    refused, exit 1, with that errno, no traceback, no temp of its config left and nothing
    else changed; once the cause is lifted the same init completes and the queue opens."""
    cut = _cut(kind, scratch, disks)
    before = snapshot(scratch)
    r = _init(cut, unprivileged_user, scratch)
    refused(r, cut.word)
    assert config_temps(cut.queue) == [], r
    if kind != "full-config":
        assert snapshot(scratch) == before, r
    cut.lift()
    again = q_ctx(cut.queue, "init")
    assert again.rc == 0 and "ready" in again.out, again
    assert "max_request_bytes=1048576\n" in (cut.queue / "config").read_text()
    assert q_ctx(cut.queue, "status").rc == 0
    assert config_temps(cut.queue) == []


@needs_root
@pytest.mark.parametrize("kind", CUTS)
def test_init_of_a_private_queue_it_cannot_complete_names_the_queue_and_the_remedy(
    kind: str, scratch: Path, disks: ScratchMounts, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/queue.md "A queue shared by a group": a user who may not write part of a queue is
    refused with EACCES naming the directory that refused, its owner, group and mode, and
    what to do; an attribute is EPERM naming it and the ``chattr -i DIR`` that removes it; a
    read-only filesystem is EROFS saying so; a full disk ENOSPC naming the directory, the
    bytes and inodes left and what to do — never bare.  So for ``init --queue DIR`` too: the
    message names the directory that refused (never a temp name of its own that no listing
    shows) and the documented remedy."""
    cut = _cut(kind, scratch, disks)
    message = refused(_init(cut, unprivileged_user, scratch), cut.word)
    assert not CONFIG_TEMP.search(message), message
    assert str(cut.refusing) in message, message
    assert cut.remedy in message, message


# ------------------------------------------------------------------------------ publish


@needs_root
@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_publish_into_an_immutable_pending_names_it_and_leaves_no_staging_file(
    queue: QueueCLI, batch: bool
) -> None:
    """Q-1, docs/queue.md "A queue shared by a group" (a write refused by a directory's
    immutable attribute is EPERM naming the attribute and the ``chattr -i DIR`` that removes
    it; publish says "nothing was published"; no temp file stays in ``inbox/``): ``pending/``
    made immutable, a publish (and a batch of two) writes its staging file and cannot move
    it.  EPERM, exit 1, naming ``Q/pending`` (not ``inbox/``, which is writable), the
    attribute and its ``chattr -i``; ``inbox/`` is empty again.  Lifted, the same publish
    goes through."""
    pending = queue.dir / "pending"
    argv = ("publish", "--batch", "-") if batch else ("publish", "--name", "pinned", "-")
    given = jsonl(GOOD, GOOD) if batch else GOOD
    before = snapshot(queue.dir)
    with attribute(pending, "i"):
        r = queue.run(*argv, "--json", input=given)
        message = refused(r, "EPERM")
        assert message == (
            f"cannot publish in queue {queue.dir}: {pending} is immutable (attribute 'i', "
            "which 'lsattr -d' shows): nothing in it may be added, moved or removed, by root "
            f"too; have root remove it with 'chattr -i {pending}'; nothing was published"
        ), r
        assert snapshot(queue.dir) == before
    again = queue.run(*argv, input=given)
    assert again.rc == 0 and len(again.lines()) == (2 if batch else 1), again
    assert len(os.listdir(pending)) == len(again.lines())
    assert os.listdir(queue.dir / "inbox") == []


def stalled(queue: QueueCLI, call: str, phase: str, when: int, *args: str) -> subprocess.Popen:
    """``ctx queue ARGS`` for ``queue``, traced so that its ``when``-th ``call`` is held
    :data:`STALL_MICROSECONDS` at ``phase`` (``delay_enter``: before the kernel runs it,
    ``delay_exit``: after)."""
    inject = f"inject={call}:{phase}={STALL_MICROSECONDS}:when={when}"
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", inject, *CTX_ARGV, "queue", *args]
    return subprocess.Popen(
        argv,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def ended(proc: subprocess.Popen, args: list[str]) -> Run:
    out, err = proc.communicate(timeout=60)
    return Run(args, proc.returncode, out.decode(), err.decode())


def staged(queue: QueueCLI, count: int = 1) -> bool:
    return wait_for(lambda: len(os.listdir(queue.dir / "inbox")) >= count, 20)


@needs_strace
def test_a_publish_whose_staging_file_recover_removes_while_it_stalls_publishes_nothing(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, Q-6, docs/queue.md "The steps" (publish step 2: a publisher stopped for longer
    than the grace period finds its staging file gone, says so — ENOENT, naming the file —
    and publishes nothing): the publish of ``slow`` is held just before its move while
    ``recover --reconcile --grace 0`` removes ``inbox/slow.req.json.publish.tmp``.  The
    publish exits 1, ENOENT naming the staging file and the recover, "nothing was
    published; publish again"; nothing is pending or staged, and publishing again works."""
    source = tmp_path / "request.json"
    source.write_text(GOOD)
    args = ["publish", "--project", "proj", "--name", "slow", str(source)]
    proc = stalled(queue, "renameat2", "delay_enter", 1, *args)
    temp = "slow.req.json.publish.tmp"
    try:
        assert staged(queue), os.listdir(queue.dir / "inbox")
        swept = queue.run("recover", "--reconcile", "--grace", "0")
        assert swept.rc == 0 and f"remove   inbox/{temp}" in swept.out, swept
    finally:
        r = ended(proc, args)
    message = said(r, "ENOENT")
    assert r.out == "", r
    assert message == (
        f"the staging file inbox/{temp} of this publish was removed before moving to pending/ "
        "(by 'ctx queue recover --reconcile --project proj', which removes temp files older "
        "than its grace, or by hand, while this publish was stopped or stalled): nothing was "
        "published; publish again"
    ), r
    assert os.listdir(queue.dir / "pending") == [] and os.listdir(queue.dir / "inbox") == []
    assert queue.publish(name="slow") == "slow.req.json"


@needs_strace
def test_a_batch_whose_last_staging_files_recover_removes_acknowledges_the_jobs_moved(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, docs/queue.md "The steps" (``publish --batch``: a refusal once the moves have
    begun acknowledges the jobs already moved as a success would — each name on stdout — and
    fails, exit 1, naming them and the lines not published; publish those lines again, and
    only those): a batch of five held before its third move while ``recover --reconcile
    --grace 0`` removes the three staging files left.  Lines 1-2 are pending and printed;
    the error is ENOENT naming the removed staging files, the two jobs and "lines 3-5".
    Those lines published again, every request is pending exactly once."""
    tools = [f"t{n}" for n in range(1, 6)]
    lines = [json.dumps({"tool": tool, "input": {}}) for tool in tools]
    source = tmp_path / "batch.jsonl"
    source.write_text(jsonl(*lines))
    args = ["publish", "--project", "proj", "--batch", str(source)]
    proc = stalled(queue, "renameat2", "delay_enter", 3, *args)
    try:
        assert wait_for(lambda: len(os.listdir(queue.dir / "pending")) == 2, 20)
        swept = queue.run("recover", "--reconcile", "--grace", "0", "--json")
        assert swept.rc == 0 and len(swept.json()["removed_temps"]) == 3, swept
    finally:
        r = ended(proc, args)
    message = said(r, "ENOENT")
    published = r.lines()
    assert len(published) == 2 and sorted(published) == sorted(os.listdir(queue.dir / "pending"))
    assert "were removed before moving to pending/" in message, r
    assert (
        f"published: {', '.join(published)} (pending, to be claimed: do not publish them "
        "again); not published: lines 3-5; publish those lines again, and only those"
    ) in message, r
    assert os.listdir(queue.dir / "inbox") == []

    rest = tmp_path / "rest.jsonl"
    rest.write_text(jsonl(*lines[2:]))
    again = queue.run("publish", "--batch", str(rest))
    assert again.rc == 0 and len(again.lines()) == 3, again
    stored = [
        json.loads((queue.dir / "pending" / name).read_text())["tool"]
        for name in os.listdir(queue.dir / "pending")
    ]
    assert sorted(stored) == tools


@needs_strace
def test_a_name_finished_while_its_publish_writes_is_refused_at_the_second_look(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, docs/queue.md "The steps" (publish step 3: holding the staging name, look for J
    again, so that a publisher whose first look came before a whole lifecycle of J is not
    acknowledged beside it): the publish of ``race`` is held after the fsync of its staging
    file while ``done/race.req.json`` and its result appear.  EEXIST, exit 1, "job
    race.req.json is already done; publish under another name"; the staging file is
    removed, the finished pair is untouched, nothing is pending."""
    source = tmp_path / "request.json"
    source.write_text(GOOD)
    args = ["publish", "--project", "proj", "--name", "race", str(source)]
    proc = stalled(queue, "fsync", "delay_exit", 1, *args)
    done = queue.dir / "done"
    try:
        assert staged(queue), os.listdir(queue.dir / "inbox")
        (done / "race.req.json").write_text('{"tool":"other","input":{}}')
        (done / "race.req.json.result").write_text('{"status":"ok","output":1}')
    finally:
        r = ended(proc, args)
    assert said(r, "EEXIST") == "job race.req.json is already done; publish under another name"
    assert r.out == "", r
    assert os.listdir(queue.dir / "inbox") == [] and os.listdir(queue.dir / "pending") == []
    assert (done / "race.req.json").read_text() == '{"tool":"other","input":{}}'


@needs_strace
def test_a_name_put_in_pending_by_hand_while_its_publish_moves_is_never_replaced(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, Q-6 (the move is no-replace: publishing a name that has evidence is refused,
    never overwritten): the publish of ``hand`` is held at its move while a person writes
    ``pending/hand.req.json``.  EEXIST, exit 1, "job hand.req.json is already pending;
    publish under another name"; the person's request keeps its bytes and the staging file
    is removed."""
    source = tmp_path / "request.json"
    source.write_text(GOOD)
    args = ["publish", "--project", "proj", "--name", "hand", str(source)]
    proc = stalled(queue, "renameat2", "delay_enter", 1, *args)
    mine = queue.dir / "pending" / "hand.req.json"
    try:
        assert staged(queue), os.listdir(queue.dir / "inbox")
        mine.write_text('{"tool":"by.hand","input":{}}')
    finally:
        r = ended(proc, args)
    assert said(r, "EEXIST") == "job hand.req.json is already pending; publish under another name"
    assert r.out == "", r
    assert mine.read_text() == '{"tool":"by.hand","input":{}}'
    assert os.listdir(queue.dir / "inbox") == []


@needs_root
def test_a_batch_that_fills_the_disk_midway_publishes_nothing_and_leaves_no_staging_file(
    disks: ScratchMounts, tmp_path: Path
) -> None:
    """Q-1, docs/queue.md "The steps" (one bad request refuses the whole batch before
    anything is written; a batch interrupted while its requests are written publishes
    nothing) and "A queue shared by a group" (ENOSPC names the directory, the bytes and
    inodes left, "nothing was published"): forty requests of 60 KB on a 1 MiB tmpfs.  The
    disk fills after a dozen staging files; the batch is ENOSPC, exit 1, nothing on stdout,
    nothing pending and every staging file it wrote removed.  On a larger disk the same
    batch publishes forty jobs, one per line."""
    disk = disks.tmpfs("small", "size=1m,mode=0755")
    q = disk / "q"
    assert q_ctx(q, "init").rc == 0
    lines = [
        json.dumps({"tool": "fs.read", "input": {"n": n, "pad": "x" * 60000}}) for n in range(40)
    ]
    source = tmp_path / "big.jsonl"
    source.write_text(jsonl(*lines))
    r = q_ctx(q, "publish", "--batch", str(source))
    message = said(r, "ENOSPC")
    assert r.out == "", r
    assert message.startswith(
        f"cannot publish in queue {q}: {q}/inbox refused: No space left on device (its "
        "filesystem has "
    ), r
    assert message.endswith(
        "nothing was published: free space on that filesystem, then publish again"
    ), r
    assert os.listdir(q / "inbox") == [] and os.listdir(q / "pending") == []
    disks.remount(disk, "size=8m")
    again = q_ctx(q, "publish", "--batch", str(source))
    assert again.rc == 0 and len(again.lines()) == 40, again
    stored = sorted(
        json.loads((q / "pending" / n).read_text())["input"]["n"] for n in again.lines()
    )
    assert stored == list(range(40))


def _from_too_big(queue: QueueCLI, tmp_path: Path, count: int) -> Run:
    """A batch of ``count`` small requests published by an agent whose name (``$CTX_AGENT``,
    the ``from`` publish fills in) is 70 000 bytes, under ``max_request_bytes=100``: each
    line is within the limit given, and too big to store."""
    with (queue.dir / "config").open("a") as config:
        config.write("max_request_bytes=100\n")
    source = tmp_path / "many.jsonl"
    source.write_text(jsonl(*['{"tool":"fs.read","input":{}}'] * count))
    env = clean_env(CTX_STORAGE=str(queue.storage), CTX_AGENT="a" * 70000)
    return queue.run("publish", "--batch", str(source), "--json", env=env)


def test_a_batch_refused_for_the_size_it_would_be_stored_at_publishes_nothing(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """§2.1 (larger requests are refused with a clear error), docs/queue.md "Configuration"
    (readers allow a stored request the limit plus 64 KiB for ``from`` and ``created``):
    a batch whose ``from`` would make every stored request larger than that is EINVAL,
    exit 1, "batch refused, nothing published", naming line 1 and the stored size; nothing
    is pending or staged."""
    before = snapshot(queue.dir / "inbox"), snapshot(queue.dir / "pending")
    message = refused(_from_too_big(queue, tmp_path, 200), "EINVAL")
    assert re.match(
        r"batch refused, nothing published: line 1: request is 700\d\d bytes once stored "
        r"\('from' and 'created' added\); this queue stores at most 65636; line 2: ",
        message,
    ), message
    assert (snapshot(queue.dir / "inbox"), snapshot(queue.dir / "pending")) == before


def test_a_batch_refused_for_the_size_it_would_be_stored_at_names_at_most_twenty_lines(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """docs/queue.md "Configuration": a batch with bad lines is refused whole, naming each
    bad line up to the twentieth (``and more from line N on, not read``), so that a batch of
    many bad lines is refused in a message of a few lines — whichever rule the lines break."""
    message = refused(_from_too_big(queue, tmp_path, 200), "EINVAL")
    named = re.findall(r"line (\d+): ", message)
    assert len(named) <= 20 and "and more from line 21" in message, len(named)
    assert len(message) < 4096, len(message)


# ----------------------------------------------------------------------------- requests


def test_every_field_problem_of_a_request_is_named_at_once(queue: QueueCLI) -> None:
    """§2.1 (``tool`` a tool name, ``input`` an object, ``from`` a string, ``created`` RFC
    3339), docs/queue.md: a request wrong in every field is refused once with every reason
    — not one per attempt — by ``publish`` and by ``publish --batch`` (naming its line after
    a good one), EINVAL, exit 1; nothing is published, not even the good line."""
    bad = '{"tool":5,"input":null,"from":[],"created":{}}'
    reasons = (
        "field 'tool' must be a string naming the tool to run; field 'input' must be a JSON "
        "object (use {} for no input); field 'from' must be a string; field 'created' must be "
        "a string (an RFC 3339 timestamp), not an object"
    )
    before = snapshot(queue.dir)
    single = refused(queue.run("publish", "-", "--json", input=bad), "EINVAL")
    assert single.startswith("invalid request: " + reasons), single
    batch = refused(
        queue.run("publish", "--batch", "-", "--json", input=jsonl(GOOD, bad)), "EINVAL"
    )
    assert batch.startswith(
        "batch refused, nothing published: line 2: invalid request: " + reasons
    ), batch
    assert "line 1" not in batch, batch
    assert snapshot(queue.dir) == before


@pytest.mark.parametrize(
    ("value", "spelled"),
    [("null", "null"), ("true", "boolean"), ('["2026-06-22T12:00:00Z"]', "array")],
    ids=["null", "true", "array"],
)
def test_a_created_that_is_no_string_is_named_in_the_json_the_user_wrote(
    queue: QueueCLI, value: str, spelled: str
) -> None:
    """§2.1, docs/queue.md (a ``created`` given must be an RFC 3339 timestamp): the refusal of
    ``"created": null`` (``true``, an array) names the value as JSON names it, as the
    refusal of a request that is ``null`` does ("must be one JSON object, not null"), never
    as Python's ``None``, ``True`` or ``[…]`` with single quotes."""
    request = f'{{"tool":"fs.read","input":{{}},"created":{value}}}'
    message = refused(queue.run("publish", "-", "--json", input=request), "EINVAL")
    assert "field 'created'" in message and spelled in message, message
    assert not re.search(r"None|True|\['", message), message


def test_tool_names_at_the_limits_of_r3_in_a_request(queue: QueueCLI) -> None:
    """R-3 (1 to 64 bytes of ``[A-Za-z0-9._-]``, first byte alphanumeric, not ending in
    ``.d``), §2.1 (``tool`` a tool name): a request naming a tool of 64 bytes is published
    and stored as given; 65 bytes, a leading dot, a ``.d`` ending, a ``/`` or a letter
    outside ASCII are each EINVAL, exit 1, naming field ``tool`` and the rule broken, and
    publish nothing."""
    longest = "t" + "x" * 63
    name = queue.run("publish", "-", input=json.dumps({"tool": longest, "input": {}}))
    assert name.rc == 0, name
    stored = json.loads((queue.dir / "pending" / name.out.strip()).read_text())
    assert stored["tool"] == longest
    before = snapshot(queue.dir)
    for tool, rule in (
        (longest + "y", "is 65 bytes long; at most 64 are allowed"),
        (".hidden", "'.hidden'"),
        ("fs.read.d", "ends in '.d', which is reserved for control directories"),
        ("fs/read", "holds '/'"),
        ("f\u00e9s", "'f\u00e9s'"),
    ):
        r = queue.run("publish", "-", "--json", input=json.dumps({"tool": tool, "input": {}}))
        message = refused(r, "EINVAL")
        assert message.startswith("invalid request: field 'tool': ") and rule in message, r
        assert snapshot(queue.dir) == before, tool
