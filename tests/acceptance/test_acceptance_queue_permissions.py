"""§2.2 and §2.4: a user who may write only part of a queue is refused with EACCES saying which
directory and what to do, before anything moves: no claim left without its lease (Q-3), no
result beside a request still claimed (Q-6), no temp file in inbox/, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, ctx_run, request
from tests.support.storage import small_tmpfs
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")

STATES = ("inbox", "pending", "claimed", "lease", "done", "failed")


@pytest.fixture
def queue(traversable_tmp: Path) -> Path:
    """A queue made by root (directories 0755), every state directory opened to all but one
    the test closes."""
    queue = traversable_tmp / "q"
    assert ctx_run("queue", "init", "--queue", queue).rc == 0
    queue.chmod(0o755)
    (queue / "config").chmod(0o644)
    for state in STATES:
        (queue / state).chmod(0o777)
    return queue


def as_user(user: UnprivilegedUser, queue: Path, *args: str, stdin: str = ""):
    env = clean_env(HOME="/nonexistent")
    return run_as(user, [*CTX_ARGV, "queue", *args, "--queue", str(queue)], env=env, stdin=stdin)


def tree(queue: Path) -> dict[str, list[str]]:
    return {state: sorted(os.listdir(queue / state)) for state in STATES}


def publish_as_root(queue: Path, name: str) -> str:
    published = ctx_run("queue", "publish", "--queue", queue, "--name", name, "-",
                        input=json.dumps(request()))  # fmt: skip
    assert published.rc == 0, published
    return published.out.strip()


@pytest.mark.parametrize("closed", ["lease", "pending", "claimed", "inbox"])
def test_a_claim_the_user_cannot_complete_moves_nothing(
    queue: Path, unprivileged_user: UnprivilegedUser, closed: str
) -> None:
    job = publish_as_root(queue, "a")
    (queue / closed).chmod(0o755)
    before = tree(queue)
    refused = as_user(unprivileged_user, queue, "claim")
    assert refused.returncode == 1, refused
    assert refused.stdout == ""
    assert refused.stderr.startswith("ctx: EACCES: cannot claim in queue"), refused.stderr
    assert f"{queue / closed}" in refused.stderr
    assert tree(queue) == before == {**{s: [] for s in STATES}, "pending": [job]}


def test_a_publish_into_a_pending_directory_the_user_cannot_write_leaves_no_temp_file(
    queue: Path, unprivileged_user: UnprivilegedUser
) -> None:
    (queue / "pending").chmod(0o755)
    for args in (["--name", "a", "-"], ["--batch", "-"]):
        refused = as_user(unprivileged_user, queue, "publish", *args,
                          stdin=json.dumps(request()) + "\n")  # fmt: skip
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("ctx: EACCES: cannot publish in queue"), refused.stderr
        assert f"{queue / 'pending'}" in refused.stderr
        assert tree(queue) == {s: [] for s in STATES}


@pytest.mark.parametrize("flag,closed", [("--ok", "done"), ("--error", "failed")])
def test_a_finish_the_user_cannot_complete_leaves_the_job_claimed(
    queue: Path, unprivileged_user: UnprivilegedUser, flag: str, closed: str
) -> None:
    job = publish_as_root(queue, "a")
    claimed = ctx_run("queue", "claim", "--queue", queue)
    assert claimed.rc == 0 and claimed.out.strip() == job, claimed
    for entry in (queue / "claimed" / job, queue / "lease" / job):
        entry.chmod(0o777)
    (queue / closed).chmod(0o755)
    before = tree(queue)
    refused = as_user(unprivileged_user, queue, "finish", job, flag, "-", stdin='{"x": 1}')
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("ctx: EACCES: cannot finish in queue"), refused.stderr
    assert f"{queue / closed}" in refused.stderr
    assert tree(queue) == before
    status = ctx_run("queue", "status", "--queue", queue, "--json")
    assert status.rc == 0 and status.json()["counts"]["claimed"] == 1, status
    assert status.json()["temps"] == [] and status.json()["incomplete"] == []


def test_a_queue_the_user_may_not_enter_is_refused_naming_the_closed_directory(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    storage = traversable_tmp / "storage"
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("bootstrap", env=env).rc == 0
    assert ctx_run("shared", "create", "--group", "0", "team", env=env).rc == 0
    outsider_env = clean_env(CTX_STORAGE=str(storage), HOME="/nonexistent")
    for verb in ("status", "list", "claim"):
        refused = run_as(unprivileged_user, [*CTX_ARGV, "queue", verb, "-p", "team", "--json"],
                         env=outsider_env)  # fmt: skip
        assert refused.returncode == 1, refused
        space = storage / "shared" / "team"
        expected = f"cannot open queue {space / 'queue'}: uid {unprivileged_user.uid} may not "
        assert refused.stderr.startswith(f"ctx: EACCES: {expected}enter {space} "), refused
        assert json.loads(refused.stdout)["error"] == "EACCES"


def test_a_config_the_user_may_not_read_is_refused_never_replaced_by_the_defaults(
    queue: Path, unprivileged_user: UnprivilegedUser
) -> None:
    (queue / "config").chmod(0o600)
    refused = as_user(unprivileged_user, queue, "publish", "-", stdin=json.dumps(request()))
    assert refused.returncode == 1, refused
    assert f"may not read {queue / 'config'} (owner uid 0" in refused.stderr, refused.stderr
    assert refused.stderr.startswith("ctx: EACCES: cannot open queue"), refused.stderr
    assert tree(queue) == {s: [] for s in STATES}


def test_a_request_the_claimer_may_not_read_stays_pending_for_one_who_may(
    queue: Path, unprivileged_user: UnprivilegedUser
) -> None:
    private = publish_as_root(queue, "private")
    readable = publish_as_root(queue, "readable")
    (queue / "pending" / private).chmod(0o600)
    claimed = as_user(unprivileged_user, queue, "claim", "--pid", "1")
    assert claimed.returncode == 0, claimed
    assert claimed.stdout == f"{readable}\n"
    nothing = as_user(unprivileged_user, queue, "claim", "--pid", "1")
    assert (nothing.returncode, nothing.stdout) == (3, ""), nothing
    assert nothing.stderr == (
        f"ctx: note: left pending, since uid {unprivileged_user.uid} may not read their "
        f"request: {private}; a member who may read them claims them\n"
    )
    assert tree(queue)["pending"] == [private]
    assert tree(queue)["claimed"] == tree(queue)["lease"] == [readable]
    assert tree(queue)["inbox"] == []
    by_root = ctx_run("queue", "claim", "--queue", queue, "--pid", "1")
    assert (by_root.rc, by_root.out) == (0, f"{private}\n"), by_root


def test_a_queue_on_a_read_only_filesystem_is_erofs_not_a_question_of_owners(
    traversable_tmp: Path,
) -> None:
    with small_tmpfs(traversable_tmp / "ro", "1m") as mountpoint:
        queue = mountpoint / "q"
        assert ctx_run("queue", "init", "--queue", queue).rc == 0
        job = publish_as_root(queue, "a")
        subprocess.run(["mount", "-o", "remount,ro", str(mountpoint)], check=True)
        for args, action, where in (
            (["publish", "-"], "publish", "inbox"),
            (["claim"], "claim", "claimed"),
        ):
            refused = ctx_run("queue", *args, "--queue", queue, input=json.dumps(request()))
            assert refused.rc == 1, refused
            assert refused.err.startswith(
                f"ctx: EROFS: cannot {action} in queue {queue}: {queue / where} is on a "
                "read-only filesystem"
            ), refused
        assert tree(queue) == {**{s: [] for s in STATES}, "pending": [job]}
