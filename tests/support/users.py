"""A real unprivileged user, for tests in which the kernel must judge a non-root uid.

The test machine runs the suite as root, and root passes every mode-bit check, so a test
that wants the kernel's opinion of an ordinary uid needs one: :func:`unprivileged_user`
creates the system user ``ctxtest`` (no home, no login shell) when running as root and it is
absent, and reuses it when present.  Without root the test is skipped with the reason, even
when that user exists (a root run made it): such a test acts as the second uid (chown, seteuid,
an agent running as it), which only root can.  Use the fixture in a suite's ``conftest.py``::

    from tests.support.users import unprivileged_user as unprivileged_user

:func:`run_as` to run a real process under that user's credentials, and :func:`access_as` to
ask the kernel what that user may do with a list of paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

TEST_USER = "ctxtest"
_USERADD_CANDIDATES = ("useradd", "/usr/sbin/useradd", "/sbin/useradd")
# Parallel test workers race to create the user; useradd then fails on the passwd lock.
_CREATE_ATTEMPTS = 10


@dataclass(frozen=True)
class UnprivilegedUser:
    name: str
    uid: int
    gid: int

    @property
    def groups(self) -> list[int]:
        """Its groups as the group database gives them (what a login would get)."""
        return os.getgrouplist(self.name, self.gid)


def find_or_create_user(name: str = TEST_USER) -> UnprivilegedUser:
    """The user ``name``, created first when running as root; ``pytest.skip`` when impossible."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to act as the test user {name!r}")
    entry = _lookup(name)
    if entry is not None:
        return _checked(entry)
    useradd = next(filter(None, map(shutil.which, _USERADD_CANDIDATES)), None)
    if useradd is None:
        pytest.skip(f"cannot create the test user {name!r}: useradd is not installed")
    failure = ""
    for _ in range(_CREATE_ATTEMPTS):
        created = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        entry = _lookup(name)
        if entry is not None:
            return _checked(entry)
        failure = created.stderr.strip()
        time.sleep(0.2)
    pytest.skip(f"cannot create the test user {name!r}: {failure}")


@pytest.fixture(scope="session")
def unprivileged_user() -> UnprivilegedUser:
    """The real non-root test user (uid, gid), created on first use when running as root."""
    return find_or_create_user()


def run_as(
    user: UnprivilegedUser,
    argv: Sequence[str],
    groups: Sequence[int] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` with exactly ``groups`` as supplementary groups (needs root),
    in ``env`` (default: ours) and ``cwd``, with ``stdin`` as its input (default: ours)."""
    return subprocess.run(
        list(argv),
        input=stdin,
        user=user.uid,
        group=user.gid,
        extra_groups=list(groups),
        env=None if env is None else dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


# faccessat(2) through sh's test: the kernel's own answer, with no interpreter the test user
# might be unable to run.
_ACCESS_SCRIPT = """
for question; do
    wanted=${question%%:*}; path=${question#*:}; granted=1
    case $wanted in *r*) test -r "$path" || granted=0;; esac
    case $wanted in *w*) test -w "$path" || granted=0;; esac
    case $wanted in *x*) test -x "$path" || granted=0;; esac
    echo $granted
done
"""


def access_as(
    user: UnprivilegedUser, questions: Sequence[tuple[str, str]], groups: Sequence[int] = ()
) -> list[bool]:
    """Ask the kernel, as ``user`` with supplementary ``groups``, for each ``(path, "rwx")``."""
    argv = ["/bin/sh", "-c", _ACCESS_SCRIPT, "sh", *(f"{rwx}:{path}" for path, rwx in questions)]
    done = run_as(user, argv, groups)
    if done.returncode != 0:
        raise RuntimeError(f"asking the kernel as {user.name} failed: {done.stderr.strip()}")
    return [line == "1" for line in done.stdout.split()]


def _lookup(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _checked(entry: pwd.struct_passwd) -> UnprivilegedUser:
    if entry.pw_uid == 0:
        pytest.skip(f"the test user {entry.pw_name!r} has uid 0; it must be unprivileged")
    return UnprivilegedUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


@contextlib.contextmanager
def group_named(name: str) -> Iterator[int]:
    """A group named ``name`` (say a number, as user and group directories may hold) with a
    gid of its own, for the time of the block; its gid.  Skips without groupadd, or when a
    group of that name exists."""
    groupadd, groupdel = shutil.which("groupadd"), shutil.which("groupdel")
    if groupadd is None or groupdel is None:
        pytest.skip("groupadd is not installed")
    groups = grp.getgrall()
    if name in {group.gr_name for group in groups}:
        pytest.skip(f"a group named {name} exists on this machine")
    taken = {group.gr_gid for group in groups}
    gid = next(gid for gid in range(54321, 60000) if gid not in taken and str(gid) != name)
    subprocess.run([groupadd, "--gid", str(gid), name], check=True)
    try:
        yield gid
    finally:
        subprocess.run([groupdel, name], check=False)


# Test files make their users and groups one process at a time (xdist workers race useradd,
# groupadd and gpasswd on the same database locks).
_ACCOUNTS_LOCK = Path(tempfile.gettempdir()) / "cortexfs-test-accounts.lock"


def system_group_with(name: str, members: Sequence[str]) -> int:
    """The system group ``name`` with ``members`` among its members, made or completed when
    needed and kept for later runs; its gid.  Skips without root, groupadd or gpasswd."""
    groupadd, gpasswd = shutil.which("groupadd"), shutil.which("gpasswd")
    if os.geteuid() != 0 or groupadd is None or gpasswd is None:
        pytest.skip(f"root, groupadd and gpasswd are needed to make group {name!r}")
    with open(_ACCOUNTS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            grp.getgrnam(name)
        except KeyError:
            subprocess.run([groupadd, "--system", name], check=True, capture_output=True)
        for member in members:
            if member not in grp.getgrnam(name).gr_mem:
                subprocess.run([gpasswd, "-a", member, name], check=True, capture_output=True)
    return grp.getgrnam(name).gr_gid


def users_named(*names: str) -> list[UnprivilegedUser]:
    """:func:`find_or_create_user` for each of ``names``, one process at a time."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to act as the test users {', '.join(names)}")
    with open(_ACCOUNTS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return [find_or_create_user(name) for name in names]


def members_of(group: str, *names: str) -> tuple[list[UnprivilegedUser], int]:
    """The users ``names`` (:func:`users_named`), members of the system group ``group``
    (:func:`system_group_with`), and its gid; skips when their groups as looked up do not
    show it."""
    users = users_named(*names)
    gid = system_group_with(group, names)
    if not all(gid in user.groups for user in users):
        pytest.skip(f"group {group} does not hold {', '.join(names)}")
    return users, gid


@contextlib.contextmanager
def process_of(user: UnprivilegedUser) -> Iterator[subprocess.Popen]:
    """A long-lived process of ``user`` with its groups, killed at the end: the live holder
    of the claims that user works on."""
    proc = subprocess.Popen(
        ["sleep", "300"], user=user.uid, group=user.gid, extra_groups=user.groups
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
