"""What the queue commands refuse before they change anything, through real subprocesses."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.queue.layout import STATE_DIRS
from tests.queue.helpers import PROJECT, dead_pid, request, write_json
from tests.support.cli import ctx

P = ("--project", PROJECT)


@pytest.fixture
def root(root: Path) -> Path:
    """The root of conftest.py (its ABI alone), with the queue ``ctx queue init`` makes."""
    assert ctx(root, "queue", "init", *P).returncode == 0
    return root


def qdir(root: Path) -> Path:
    return root / "shared" / PROJECT / "queue"


def tree(queue_dir: Path) -> dict[str, list[str]]:
    return {state: sorted(os.listdir(queue_dir / state)) for state in STATE_DIRS}


# Every queue command, with what it needs to get as far as opening the queue.
EVERY_COMMAND = {
    "init": ("init",),
    "publish": ("publish", "--name", "j", "-"),
    "claim": ("claim",),
    "renew": ("renew", "j"),
    "finish": ("finish", "j", "--ok"),
    "status": ("status",),
    "list": ("list",),
    "show": ("show", "j"),
    "recover": ("recover", "--reconcile"),
    "work": ("work", "--drain", "--agent", "a"),
}


@pytest.mark.parametrize("linked", ["shared/elsewhere", "shared"])
@pytest.mark.parametrize("command", EVERY_COMMAND.values(), ids=EVERY_COMMAND.keys())
def test_a_project_reached_through_a_symlink_is_refused_by_every_command(
    root: Path, tmp_path: Path, linked: str, command: tuple[str, ...]
) -> None:
    """Q-8: no component of shared/P/queue is followed, not only the queue's own: a symlinked
    space (or shared/ itself) would take the jobs outside the storage root."""
    outside = tmp_path / "outside"
    made = ctx(root, "queue", "init", "--queue", str(outside / "elsewhere" / "queue"))
    assert made.returncode == 0, made.stderr
    write_json(outside / "elsewhere" / "queue" / "pending" / "j.req.json", request())
    if linked == "shared":
        os.rename(root / "shared", outside / "shared")
        (outside / "shared" / "elsewhere").symlink_to(outside / "elsewhere")
        (root / "shared").symlink_to(outside / "shared")
        link = root / "shared"
    else:
        link = root / "shared" / "elsewhere"
        link.symlink_to(outside / "elsewhere")
    before = tree(outside / "elsewhere" / "queue")

    done = ctx(root, "queue", *command, "--project", "elsewhere", stdin='{"tool":"t","input":{}}')

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"ctx: ELOOP: {link} is a symlink"), done.stderr
    assert tree(outside / "elsewhere" / "queue") == before
    assert link.is_symlink()


def test_a_projects_queue_path_given_with_queue_is_walked_the_same_way(
    root: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside" / "queue").mkdir(parents=True)
    (root / "shared" / "elsewhere").symlink_to(tmp_path / "outside")
    for option in ("--queue", "--project"):
        done = ctx(root, "queue", "init", option, str(root / "shared" / "elsewhere" / "queue"))
        assert done.returncode == 1 and "ELOOP" in done.stderr, done.stderr
    assert os.listdir(tmp_path / "outside" / "queue") == []


def test_a_link_to_a_projects_queue_is_refused_and_names_the_project_to_use(
    root: Path, tmp_path: Path
) -> None:
    """Q-8: a path that reaches P's queue through a symbolic link (beside it in the space, or
    anywhere outside the root) is not followed; the refusal says so and names --project P,
    where 'not a project's queue' would send the user looking for a queue that is there."""
    in_space = root / "shared" / PROJECT / "linked"
    in_space.symlink_to("queue")
    outside = tmp_path / "to-the-queue"
    outside.symlink_to(qdir(root))
    for link in (in_space, outside):
        for option in ("--queue", "--project"):
            done = ctx(root, "queue", "status", option, str(link))
            assert done.returncode == 1, done.stderr
            assert done.stderr == (
                f"ctx: ELOOP: {option} {link} leads through a symbolic link to project "
                f"{PROJECT}'s queue; a queue is reached without following one (Q-8): use "
                f"--project {PROJECT}\n"
            )


def test_a_queue_path_going_up_through_no_link_is_the_queue_it_names(root: Path) -> None:
    """§2.4 "--project NAME (or a queue path)": '..' are read as the directory they lead to
    when they pass no symbolic link, so '../queue' typed in the space's data/ is its queue."""
    data = root / "shared" / PROJECT / "data"
    for path in ("../queue", str(data / ".." / "queue")):
        shown = ctx(root, "queue", "status", "--project", path, "--json", cwd=data)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["queue"] == str(qdir(root)), shown.stdout


def plant_symlinked_done(queue_dir: Path, tmp_path: Path) -> None:
    os.rmdir(queue_dir / "done")
    (queue_dir / "done").symlink_to(tmp_path)


def plant_file_as_done(queue_dir: Path, tmp_path: Path) -> None:
    os.rmdir(queue_dir / "done")
    (queue_dir / "done").write_text("")


def plant_unknown_config_key(queue_dir: Path, tmp_path: Path) -> None:
    with open(queue_dir / "config", "a") as config:
        config.write("bogus=1\n")


def plant_symlinked_config(queue_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config").write_text("grace=1\n")
    os.unlink(queue_dir / "config")
    (queue_dir / "config").symlink_to(tmp_path / "config")


PLANTED = {
    "symlinked-state-dir": plant_symlinked_done,
    "file-as-state-dir": plant_file_as_done,
    "unknown-config-key": plant_unknown_config_key,
    "symlinked-config": plant_symlinked_config,
}


@pytest.mark.parametrize("plant", PLANTED.values(), ids=PLANTED.keys())
def test_init_refuses_an_existing_queue_every_other_command_refuses(
    root: Path, tmp_path: Path, plant: object
) -> None:
    """init never says "ready" for a queue the other commands refuse: it checks what exists
    as they do, refuses with their error (exit 1), and changes nothing, not even a missing
    state directory it would otherwise make."""
    queue_dir = qdir(root)
    plant(queue_dir, tmp_path)  # type: ignore[operator]
    status = ctx(root, "queue", "status", *P)
    assert status.returncode == 1 and status.stderr.startswith("ctx: E"), status.stderr
    os.rmdir(queue_dir / "failed")
    planted = sorted(os.listdir(queue_dir))

    init = ctx(root, "queue", "init", *P)

    assert (init.returncode, init.stdout, init.stderr) == (1, "", status.stderr)
    assert sorted(os.listdir(queue_dir)) == planted


def test_init_repairs_a_missing_state_directory(root: Path) -> None:
    os.rmdir(qdir(root) / "lease")
    assert ctx(root, "queue", "status", *P).returncode == 1
    init = ctx(root, "queue", "init", *P)
    assert init.returncode == 0 and init.stdout.endswith("ready (1 entry created)\n")
    assert ctx(root, "queue", "status", *P).returncode == 0


UNUSABLE_WORKER_IDS = {
    "too-long": "a" * 100_000,
    "256-bytes": "é" * 128,
    "control-character": "w\x1b]0;x\x07",
    "line-break": "w\nx",
}


@pytest.mark.parametrize("worker", UNUSABLE_WORKER_IDS.values(), ids=UNUSABLE_WORKER_IDS.keys())
@pytest.mark.parametrize("command", [("claim",), ("work", "--drain", "--agent", "a")])
def test_a_worker_id_no_lease_may_record_is_a_usage_error_before_any_claim(
    root: Path, worker: str, command: tuple[str, ...]
) -> None:
    """A lease holding a 100 000-byte id is one its own readers refuse (EFBIG): claimed with
    it, the job would be a conflict recover never requeues."""
    write_json(qdir(root) / "pending" / "j.req.json", request())
    before = tree(qdir(root))

    done = ctx(root, "queue", *command, *P, "--worker", worker)

    assert done.returncode == 2, done.stderr
    assert "ctx: EINVAL: Invalid value for '--worker': worker id" in done.stderr
    assert len(done.stderr) < 1000
    assert tree(qdir(root)) == before


def test_a_worker_id_of_the_longest_length_is_recorded(root: Path) -> None:
    write_json(qdir(root) / "pending" / "j.req.json", request())
    longest = "é" * 127 + "a"  # 255 bytes
    done = ctx(root, "queue", "claim", *P, "--worker", longest, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lease"]["worker"] == longest


@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_what_is_planted_at_a_staging_name_is_removed_by_reconcile(
    root: Path, tmp_path: Path, planted: str
) -> None:
    """Q-6: stray entries at a staging name of inbox/ go after the grace period, whatever they
    are but a directory; a symlink is unlinked, never followed, and its name can be published
    again.  The refusal said so."""
    target = tmp_path / "target"
    target.write_text("kept")
    staged = qdir(root) / "inbox" / "a.req.json.publish.tmp"
    if planted == "symlink":
        staged.symlink_to(target)
    else:
        os.mkfifo(staged)
    body = '{"tool": "t", "input": {}}'

    blocked = ctx(root, "queue", "publish", *P, "--name", "a", "-", stdin=body)
    status = ctx(root, "queue", "status", *P)
    reconciled = ctx(root, "queue", "recover", *P, "--reconcile", "--grace", "0")
    again = ctx(root, "queue", "publish", *P, "--name", "a", "-", stdin=body)

    kind = "symlink" if planted == "symlink" else "FIFO"
    assert blocked.returncode == 1
    remedy = f"'ctx queue recover --reconcile --project {PROJECT}' removes it"
    assert f"is a {kind}, not a temp file; {remedy}" in blocked.stderr
    assert f"temp       inbox/a.req.json.publish.tmp ({kind}, " in status.stdout
    assert reconciled.returncode == 0
    assert "remove   inbox/a.req.json.publish.tmp\n" in reconciled.stdout
    assert "0 stale temps, 1 temps removed: queue consistent\n" in reconciled.stdout
    assert (again.returncode, again.stdout) == (0, "a.req.json\n")
    assert target.read_text() == "kept"


def test_a_directory_at_a_staging_name_is_left_and_said_to_need_removing_by_hand(
    root: Path,
) -> None:
    (qdir(root) / "inbox" / "a.req.json.publish.tmp").mkdir()
    blocked = ctx(root, "queue", "publish", *P, "--name", "a", "-", stdin='{"tool":"t","input":{}}')
    reconciled = ctx(root, "queue", "recover", *P, "--reconcile", "--grace", "0")
    assert blocked.returncode == 1 and "remove it by hand" in blocked.stderr
    assert "ignored  inbox/a.req.json.publish.tmp: a directory" in reconciled.stdout
    assert (qdir(root) / "inbox" / "a.req.json.publish.tmp").is_dir()


def ctx_without_stdout(root: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``ctx ARGS… >&-``: started with its standard output closed."""
    return subprocess.run(
        [sys.executable, "-m", "cortexfs", *args],
        input=stdin,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
        preexec_fn=lambda: os.close(1),
        timeout=60,
    )


ANSWERED_ON_STDOUT = {
    "publish": ("publish", *P, "--name", "new", "-"),
    "claim": ("claim", *P),
    "finish-json": ("finish", *P, "CLAIMED", "--ok", "--json"),
    "recover-json": ("recover", *P, "--reconcile", "--json"),
    "work-json": ("work", *P, "--drain", "--agent", "a", "--json"),
}


@pytest.mark.parametrize("command", ANSWERED_ON_STDOUT.values(), ids=ANSWERED_ON_STDOUT.keys())
def test_a_command_whose_answer_is_on_stdout_refuses_to_start_with_it_closed(
    root: Path, command: tuple[str, ...]
) -> None:
    """`claim >&-` would lease a job nobody could ever name: refused (EBADF) before anything
    is published, claimed, finished or recovered."""
    for name in ("first", "second"):
        write_json(qdir(root) / "pending" / f"{name}.req.json", request())
    claimed = ctx(root, "queue", "claim", *P, "--pid", str(dead_pid()), "--json")
    job = json.loads(claimed.stdout)["name"]  # its holder is gone: recover would requeue it
    before = tree(qdir(root))

    args = [job if arg == "CLAIMED" else arg for arg in command]
    done = ctx_without_stdout(root, "queue", *args, stdin='{"tool": "t", "input": {}}')

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ctx: EBADF: standard output is closed, so ")
    assert "nothing was done" in done.stderr
    assert tree(qdir(root)) == before


@pytest.mark.parametrize(
    "command",
    [("finish", *P, "CLAIMED", "--ok", "-"), ("publish", *P, "--name", "new", "-")],
    ids=["finish", "publish"],
)
def test_reading_dash_from_a_closed_stdin_is_refused_before_anything_is_done(
    root: Path, command: tuple[str, ...]
) -> None:
    """`finish J --ok - <&-` would record an empty output nobody gave, for good: refused
    (EBADF), as a closed standard output is for a command whose answer it is."""
    write_json(qdir(root) / "pending" / "first.req.json", request())
    job = json.loads(ctx(root, "queue", "claim", *P, "--json").stdout)["name"]
    before = tree(qdir(root))

    args = [job if arg == "CLAIMED" else arg for arg in command]
    done = subprocess.run(
        [sys.executable, "-m", "cortexfs", "queue", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
        preexec_fn=lambda: os.close(0),
        timeout=60,
    )

    assert done.returncode == 1, done.stderr
    what = "result" if command[0] == "finish" else "request"
    assert done.stderr == (
        f"ctx: EBADF: standard input is closed: there is no {what} to read; give a FILE, or "
        f"pipe the {what} in; nothing was done\n"
    )
    assert tree(qdir(root)) == before


def test_a_command_that_only_reports_works_with_stdout_closed(root: Path) -> None:
    write_json(qdir(root) / "pending" / "waiting.req.json", request())
    assert ctx_without_stdout(root, "queue", "status", *P).returncode == 0
    assert ctx_without_stdout(root, "queue", "recover", *P).returncode == 0


def _suggested(text: str) -> list[str]:
    """The ``'ctx queue …'`` commands a message suggests, as the user would copy them."""
    return [shlex.split(quoted)[1:] for quoted in re.findall(r"'(ctx queue [^']*)'", text)]


@pytest.mark.parametrize(
    "given",
    [
        lambda root: ["--storage", str(root), "--project", PROJECT],
        lambda root: ["--queue", str(qdir(root))],
    ],
    ids=["project", "queue"],
)
def test_a_suggested_queue_command_names_the_queue_the_command_was_given(
    root: Path, tmp_path: Path, given
) -> None:
    """§2.4: a refusal or a note that suggests another queue command names the queue it was
    given, so that the suggestion, copied into a shell where neither CTX_STORAGE nor
    CTX_PROJECT says it, acts on that queue."""
    assert (
        ctx(
            root, "queue", "publish", *P, "--name", "j", "-", stdin=json.dumps(request())
        ).returncode
        == 0
    )
    elsewhere = {"CTX_STORAGE": str(tmp_path / "other-root"), "CTX_PROJECT": ""}
    claimed = ctx(root, "queue", "claim", *given(root), "--pid", str(dead_pid()), env=elsewhere)
    assert claimed.returncode == 0, claimed.stderr
    refused = ctx(root, "queue", "finish", *given(root), "--ok", "nosuch", env=elsewhere)
    assert refused.returncode == 1, refused.stderr
    suggestions = _suggested(claimed.stderr) + _suggested(refused.stderr)
    assert [words[1] for words in suggestions] == ["recover", "list"], suggestions
    for words in suggestions:
        again = subprocess.run(
            [sys.executable, "-m", "cortexfs", *words],
            capture_output=True,
            text=True,
            env={**os.environ, **elsewhere},
        )
        assert again.returncode == 0, (words, again.stderr)
    assert tree(qdir(root))["pending"] == ["j.req.json"]  # the recover it suggested requeued j
