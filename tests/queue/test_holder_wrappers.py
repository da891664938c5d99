"""Who holds the lease of a ``ctx queue claim`` run through ``flock -c``, ``sh -c`` and the
like (SPEC §2.4, Q-5): the shell that goes on working on the job, never a process that ends
with the claim, which ``recover`` would find gone at once.  Real wrappers around the real
``ctx`` of the venv, typed as a user types it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cortexfs.queue.holder import _su_runs_command_string
from tests.queue.helpers import PROJECT, request, write_json

VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
CLAIM = f"ctx queue claim --project {PROJECT}"
RECOVER = f"ctx queue recover --project {PROJECT} --json"


@pytest.fixture
def root(root: Path, tmp_path: Path) -> Path:
    """The root of conftest.py (its ABI alone), with one job pending in the project's queue."""
    run_ctx(root, "queue", "init", "--project", PROJECT)
    job = write_json(tmp_path / "req.json", request(1))
    run_ctx(root, "queue", "publish", "--project", PROJECT, "--name", "j", str(job))
    return root


def environment(root: Path, **extra: str) -> dict[str, str]:
    """Ours, with the venv's ``ctx`` first on PATH and ``root`` as the storage root."""
    path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "CTX_STORAGE": str(root), **extra}


def run_ctx(root: Path, *args: str) -> str:
    done = subprocess.run(
        [VENV_BIN / "ctx", *args], capture_output=True, text=True, env=environment(root)
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def in_sh(root: Path, script: str, **env: str) -> list[str]:
    """The lines ``sh -c SCRIPT`` prints (dash on Debian), which must succeed."""
    done = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=environment(root, **env)
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def lease_pid(root: Path, job: str = "j.req.json") -> int:
    lease = root / "shared" / PROJECT / "queue" / "lease" / job / "worker"
    return json.loads(lease.read_text())["pid"]


CTX_PATH = VENV_BIN / "ctx"
# su and runuser change to root without a password only for root.
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="su and runuser to root need root")


@pytest.mark.parametrize(
    ("claim", "login_shell", "passed_over"),
    [
        # flock runs '$SHELL -c STRING': bash replaces itself with the command, dash does not,
        # and a shell is the parent §2.4 names, even with nothing left to do
        (f'flock {{lock}} -c "{CLAIM}"', "/bin/bash", True),
        (f'flock {{lock}} -c "{CLAIM}"', "/bin/sh", False),
        (f"flock {{lock}} --command \"{CLAIM} --ttl '60'\"", "/bin/sh", False),
        (f'timeout 60 sh -c "{CLAIM}"', "/bin/bash", False),
        (f'timeout 60 bash -c "{CLAIM}"', "/bin/bash", True),
        (f'timeout 60 sh -c "exec {CLAIM}"', "/bin/bash", True),
        (f"timeout 60 sh -c \"sh -c '{CLAIM}'\"", "/bin/bash", False),
        (
            f'timeout 60 flock {{lock}} -c "exec {CTX_PATH} queue claim -p {PROJECT}"',
            "/bin/sh",
            True,
        ),
        (f'sh -c "{sys.executable} -m cortexfs queue claim --project={PROJECT}"', "/bin/sh", False),
        # A wrapper's shell that replaced itself with the claim, whatever its string held
        # before: the wrapper's one child is the claim
        (f"timeout 60 bash -c 'ctx queue claim --project \"$1\"' _ {PROJECT}", "/bin/sh", True),
        (f"timeout 60 sh -c 'exec {CLAIM} 2>/dev/null'", "/bin/sh", True),
        (f"timeout 60 sh -c 'cd / && exec {CLAIM}'", "/bin/sh", True),
        (f"timeout 60 bash -c 'test -d / || exit; {CLAIM}'", "/bin/sh", True),
        # A shell is the holder, whatever its string
        (f"sh -c 'ctx queue claim --project \"$1\"' _ {PROJECT}", "/bin/sh", False),
        (f"sh -c 'ctx \"$@\" 2>/dev/null' sh queue claim --project {PROJECT}", "/bin/sh", False),
        (
            "flock {lock} -c 'cd / && ctx queue claim --project \"$P\" 2>/dev/null'",
            "/bin/sh",
            False,
        ),
        # su and runuser run '$SHELL -c STRING' for the user as flock does (root's is bash)
        pytest.param(f"runuser root -c '{CLAIM}'", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(f"runuser -c '{CLAIM}' root", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(f"su -c '{CLAIM}' root", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(f"su --command '{CLAIM}' root", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(
            f"su --command='cd / && exec {CLAIM}' -s /bin/sh root", "/bin/sh", True, marks=AS_ROOT
        ),
        pytest.param(f"su --command='{CLAIM}' -s /bin/sh root", "/bin/sh", False, marks=AS_ROOT),
        pytest.param(
            "runuser -s /bin/sh root -c 'exec ctx queue claim --project \"$P\"'",
            "/bin/sh",
            True,
            marks=AS_ROOT,
        ),
        # su's and runuser's other ways to give the string, as their getopt reads them
        pytest.param(
            f"su --session-command='exec {CLAIM}' -s /bin/sh root", "/bin/sh", True, marks=AS_ROOT
        ),
        pytest.param(
            f"runuser -s /bin/sh root --session-command 'exec {CLAIM}'",
            "/bin/sh",
            True,
            marks=AS_ROOT,
        ),
        pytest.param(f"su -s /bin/sh -c'exec {CLAIM}' root", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(
            f"su -s /bin/sh -lc "
            f"'CTX_STORAGE={{root}} exec {CTX_PATH} queue claim -p {PROJECT}' root",
            "/bin/sh",
            True,
            marks=AS_ROOT,
        ),
        # getopt_long takes a long option by any prefix it alone starts
        pytest.param(f"su -s /bin/sh --comm='exec {CLAIM}' root", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(
            f"runuser -s /bin/sh root --sess 'exec {CLAIM}'", "/bin/sh", True, marks=AS_ROOT
        ),
        # the words after the user go to its shell: '-c STRING' among them is the shell's
        pytest.param(f"su -s /bin/sh root -- -c 'exec {CLAIM}'", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(f"su -s /bin/sh -- root -c 'exec {CLAIM}'", "/bin/sh", True, marks=AS_ROOT),
        pytest.param(
            f"runuser -s /bin/sh - root -- -c "
            f"'CTX_STORAGE={{root}} exec {CTX_PATH} queue claim -p {PROJECT}'",
            "/bin/sh",
            True,
            marks=AS_ROOT,
        ),
        # flock takes -c as a word of its own: a group is not its command string
        (f"flock -n {{lock}} -c 'exec {CLAIM}'", "/bin/sh", True),
        # a login shell ('-sh'), with the environment cleared
        pytest.param(
            f"su - -s /bin/sh root -c "
            f"'CTX_STORAGE={{root}} exec {CTX_PATH} queue claim -p {PROJECT}'",
            "/bin/sh",
            True,
            marks=AS_ROOT,
        ),
    ],
)
def test_a_claim_a_wrapper_runs_leases_to_the_calling_shell(
    root: Path, tmp_path: Path, claim: str, login_shell: str, passed_over: bool
) -> None:
    """A wrapper whose one child is the claim — ``timeout``, ``flock -c``, ``su -c`` and
    ``runuser -c`` whose shell replaced itself with it — ends with the claim: the lease names
    the shell whose ``$(…)`` it is, and ``recover`` leaves the job claimed while that shell
    lives.  A shell that ran the claim as its child (dash does) is the claim's parent, which
    §2.4 names, and which ends with it: recover requeues the job (scripts pass ``--pid $$``)."""
    command = claim.format(lock=tmp_path / "lock", root=root)
    script = f'J=$({command}) || exit 9; echo "$J"; {RECOVER}; echo "$$"'
    job, recovered, shell = in_sh(root, script, SHELL=login_shell, P=PROJECT)

    assert job == "j.req.json"
    requeued = [r["job"] for r in json.loads(recovered)["requeued"]]
    claimed = os.listdir(root / "shared" / PROJECT / "queue" / "claimed")
    if passed_over:
        assert lease_pid(root) == int(shell)
        assert (requeued, claimed) == ([], [job]), recovered
    else:
        assert (requeued, claimed) == ([job], []), recovered


def test_a_wrapper_that_leads_a_session_of_its_own_is_the_holder(root: Path) -> None:
    """``setsid timeout 60 ctx queue claim``: timeout leads a new session, in which its
    starter, the shell, cannot be, any more than a subreaper that adopted it: the walk stops
    at timeout, which ends with the claim, and recover requeues the job (scripts pass
    ``--pid $$`` here)."""
    script = f'J=$(setsid timeout 60 {CLAIM}) || exit 9; echo "$$"'
    (shell,) = in_sh(root, script)
    assert lease_pid(root) != int(shell)
    requeued = json.loads(run_ctx(root, *RECOVER.split()[1:]))["requeued"]
    assert [r["job"] for r in requeued] == ["j.req.json"]


@pytest.mark.parametrize(
    "renew",
    [
        f'timeout 60 sh -c "exec ctx queue renew --project {PROJECT} $J"',
        f'timeout 10 bash -c \'ctx queue renew --project {PROJECT} "$1"\' _ "$J"',
        pytest.param(f'runuser root -c "ctx queue renew --project {PROJECT} $J"', marks=AS_ROOT),
    ],
)
def test_a_renewal_a_shell_runs_for_a_wrapper_renews_the_calling_shells_lease(
    root: Path, renew: str
) -> None:
    script = f'J=$({CLAIM}) && {renew} >/dev/null && echo "$$"'
    (shell,) = in_sh(root, script)
    assert lease_pid(root) == int(shell)


@pytest.mark.parametrize(
    "string",
    [
        CLAIM,  # nothing but the claim
        f"{CLAIM}; true",
        f"{CLAIM} | cat",
        f"{CLAIM} 2>/dev/null </dev/null",
        f"cd / && {CLAIM}",
        f'{CLAIM} --worker "$HOME"',
    ],
)
def test_a_shell_that_runs_the_claim_is_its_holder(root: Path, tmp_path: Path, string: str) -> None:
    """A shell is the parent process §2.4 names, whatever its -c string holds, even when it
    has nothing left to do after the claim: the lease names it."""
    pid_file = tmp_path / "inner"
    # The inner shell writes its pid, then becomes 'sh -c STRING' in the same process.
    inner = f'sh -c \'echo $$ >{pid_file}; exec sh -c "$0"\' "$S"'
    script = f'J=$({inner}) || exit 9; echo "$J"; echo "$$"'
    job, shell = in_sh(root, script, S=string)

    assert job == "j.req.json"
    assert lease_pid(root) == int(pid_file.read_text()) != int(shell)


@pytest.mark.parametrize(
    ("wrapped", "login_shell"),
    [
        (f"timeout 60 bash -c 'echo $$ >{{pid}}; {CLAIM}; true'", "/bin/sh"),
        (f"timeout 60 bash -c 'echo $$ >{{pid}}; {CLAIM} && true'", "/bin/sh"),
        (f"timeout 60 sh -c 'echo $$ >{{pid}}; {CLAIM} 2>/dev/null; true'", "/bin/sh"),
        (f"flock {{lock}} -c 'echo $$ >{{pid}}; {CLAIM} || true'", "/bin/bash"),
        pytest.param(f"su root -c 'echo $$ >{{pid}}; {CLAIM}; true'", "/bin/sh", marks=AS_ROOT),
        pytest.param(
            f"runuser -c 'echo $$ >{{pid}}; {CLAIM} | cat' root", "/bin/sh", marks=AS_ROOT
        ),
    ],
)
def test_a_shell_a_wrapper_runs_with_more_to_do_is_the_holder(
    root: Path, tmp_path: Path, wrapped: str, login_shell: str
) -> None:
    """A wrapper is passed over only for the one child it waits for: a shell under it that
    runs the claim and goes on (bash does not replace itself with a command that is not
    the last) is the claim's parent, and holds the lease, as it would with no wrapper."""
    pid_file = tmp_path / "shell"
    command = wrapped.format(pid=pid_file, lock=tmp_path / "lock")
    script = f'J=$({command}) || exit 9; echo "$J"'
    (job,) = in_sh(root, script, SHELL=login_shell)

    assert job == "j.req.json"
    assert lease_pid(root) == int(pid_file.read_text())
    requeued = json.loads(run_ctx(root, *RECOVER.split()[1:]))["requeued"]
    assert [r["job"] for r in requeued] == [job]  # that shell has ended


# A subreaper (PR_SET_CHILD_SUBREAPER) that runs its arguments in a session of their own and
# reaps whatever they leave behind, as 'systemd --user' does for what it starts.
SUBREAPER = """
import ctypes, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
subprocess.run(sys.argv[1:], start_new_session=True, check=True)
try:
    while True:
        os.wait()
except ChildProcessError:
    pass
"""


def test_a_wrapper_a_subreaper_adopted_is_the_holder_not_the_subreaper(
    root: Path, tmp_path: Path
) -> None:
    """``(flock FILE ctx queue claim &)`` in a session of its own under a subreaper: the
    subshell that started flock is gone when the claim asks who called it, and the subreaper
    adopted flock.  A lease naming the subreaper would hold the job, which no one works on,
    until it expires; naming flock, which ends with the claim, lets ``recover`` requeue it."""
    lock = tmp_path / "lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the claim waits in flock until we let it go
        subreaper = subprocess.Popen(
            [sys.executable, "-c", SUBREAPER, "sh", "-c", f"(flock {lock} {CLAIM} &)"],
            env=environment(root),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            flock = wait_for_child(subreaper.pid, "flock")
        finally:
            held.close()  # the lock goes with it: flock starts the claim
            subreaper.wait(timeout=60)  # which reaps flock once the claim is made

    assert lease_pid(root) == flock.pid != subreaper.pid
    requeued = json.loads(run_ctx(root, *RECOVER.split()[1:]))["requeued"]
    assert [r["job"] for r in requeued] == ["j.req.json"]


@pytest.mark.parametrize(
    ("started", "wrapper"),
    [
        (f"setsid -f timeout 60 flock {{lock}} {CLAIM}", "timeout"),
        (f"setsid -f sh -c 'flock {{lock}} {CLAIM}'", "sh"),
    ],
)
def test_a_session_leader_a_subreaper_adopted_is_the_holder_not_the_subreaper(
    root: Path, tmp_path: Path, started: str, wrapper: str
) -> None:
    """``setsid -f timeout 60 ctx queue claim`` under a subreaper: setsid's fork makes timeout
    (or the ``sh -c``) lead a session of its own and leaves it to the subreaper.  The leader's
    parent is in another session whether it started it or adopted it, so the walk stops at
    the leader, which ends with the claim: recover requeues the job, where a lease naming
    the subreaper held it until it expired."""
    lock = tmp_path / "lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the claim waits in flock until we let it go
        subreaper = subprocess.Popen(
            [sys.executable, "-c", SUBREAPER, "sh", "-c", started.format(lock=lock)],
            env=environment(root),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            leader = wait_for_child(subreaper.pid, wrapper)
            assert os.getsid(leader.pid) == leader.pid
        finally:
            held.close()
            subreaper.wait(timeout=60)

    assert lease_pid(root) == leader.pid != subreaper.pid
    requeued = json.loads(run_ctx(root, *RECOVER.split()[1:]))["requeued"]
    assert [r["job"] for r in requeued] == ["j.req.json"]


def wait_for_child(parent: int, name: str) -> psutil.Process:
    """The child called ``name`` that ``parent`` has once it adopted it (its starter gone):
    not the shell ``parent`` started, which runs ``setsid`` and may not have ended yet."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(parent).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.name() == name and "setsid" not in " ".join(child.cmdline()):
                    return child
        time.sleep(0.02)
    raise AssertionError(f"no {name} was adopted by {parent}")


@pytest.mark.parametrize(
    ("arguments", "runs_string"),
    [
        (["-Tc", "x", "root"], True),  # --no-pty, util-linux 2.39 and later
        (["--no-pty", "--c=x", "root"], True),
        (["--s", "x", "root"], False),  # --shell, --session-command, --supp-group: ambiguous
        (["-s", "-c", "root"], False),  # '-c' is the shell -s names
        (["-g", "wheel", "root", "-c"], False),  # -c without its string
        (["root", "--", "-l", "-c", "x"], False),  # the shell's first word is no -c
    ],
)
def test_su_and_runuser_options_are_read_as_getopt_long_reads_them(
    arguments: list[str], runs_string: bool
) -> None:
    """Forms this machine's su may not take, or that run no command string: only the one
    child of a wrapper that runs ``$SHELL -c STRING`` is passed over."""
    assert _su_runs_command_string(arguments) is runs_string
