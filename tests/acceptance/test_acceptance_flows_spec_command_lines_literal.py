"""The command lines, file layouts, exit statuses and output contracts that SPEC.md writes out
literally, each run exactly as SPEC spells it (options, argument order, paths) against a fresh
storage root, asserting only what SPEC states: what a user who knows nothing but SPEC.md gets.

* §1 R-1, R-2, R-5: ``ctx bootstrap [SOURCE]``, the six root entries, the core tools and their
  T-1 controls, ``tool/tsh.d/config``, ``shared/cortexfs-docs/``; the non-root default root
  ``$XDG_DATA_HOME/cortexfs/storage/current``;
* §2, §2.1, §2.4 Q-1…Q-8: every ``ctx queue`` line of the §2.4 block (init, publish FILE | -,
  --name, --batch FILE | -, claim --worker --pid --ttl, renew, finish --ok | --error
  [RESULT_FILE | -], status, list --state, show, recover --reconcile --dry-run --grace, work
  --drain --max-jobs --concurrency), the exit statuses 0/1/2/3, "J alone on its own line",
  the evidence of each durable state, ``--project`` given a queue path, ``--storage DIR``;
* §4 S-1, S-5: ``ctx session repair`` on the literal session layouts;
* §5 P-8: ``ctx policy check FILE...`` (``FILE:LINE: EINVAL: <reason>``) and
  ``ctx policy query --policy FILE [--policy FILE ...] SUBJECT CLASS:NAME PERM``;
* §6 T-1, T-2, T-4, T-8, T-8a: the literal tool invocations through a mount,
  ``ctx object which|list|check|install --source STORAGE MANIFEST --tier …``;
* §7 H-1, H-3, H-4: ``ctx tool NAME [ARG...]``, the literal ``tsh.d/config`` settings;
* §10 M-1…M-4: ``ctxmcp list`` and ``ctxmcp project`` as printed;
* §12 D-1: ``ctx man TOPIC`` and its aliases, the fallback, ``ctx bootstrap SOURCE``;
* §13 F-1: ``ctx mount MOUNTPOINT [--as AGENT]``, ``ctx umount``, SIGTERM.

Real processes, real directories, a real FUSE mount under /tmp/<file stem>-<uid>/ and a real
second uid; nothing of the product is imported."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    QUEUE_SUBDIRS,
    REPO,
    ROOT_ENTRIES,
    Run,
    age,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    new_scratch_dir,
    request,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
SUFFIX = ".req.json"
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
# T-1: the controls of every tool's control directory.
CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log")
STABLE_MCP_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")


# ------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """A storage root made by the literal ``ctx bootstrap`` (CTX_STORAGE names it)."""
    root = tmp_path / "fresh"
    made = ctx_run("bootstrap", env=clean_env(CTX_STORAGE=str(root)))
    assert made.rc == 0, made
    return root


def on(root: Path, *args: str | os.PathLike, **kw) -> Run:
    """``ctx ARGS`` with ``CTX_STORAGE=root`` (the §2.4 alternative to ``--storage DIR``)."""
    kw.setdefault("env", clean_env(CTX_STORAGE=str(root)))
    return ctx_run(*args, **kw)


def queue_dir(root: Path, project: str = "proj") -> Path:
    return root / "shared" / project / "queue"


def request_file(directory: Path, name: str = "req.json", **extra) -> Path:
    path = directory / name
    path.write_text(json.dumps(request(**extra)))
    return path


def publish(root: Path, project: str = "proj", *options: str, **extra) -> str:
    """``ctx queue publish --project P [OPTIONS] -``: the J it printed."""
    made = on(
        root,
        "queue",
        "publish",
        "--project",
        project,
        *options,
        "-",
        input=json.dumps(request(**extra)),
    )
    assert made.rc == 0, made
    return made.out.strip()


def evidence(root: Path, project: str = "proj") -> dict[str, tuple]:
    return snapshot(queue_dir(root, project))


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def pid_ns_inode() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


# ------------------------------------------------------------------------------------------
# §1: bootstrap, the root ABI and the default root


def test_r5_r2_h1_h4_bootstrap_lays_out_exactly_what_spec_names(tmp_path: Path) -> None:
    """``ctx bootstrap`` on an empty place: the six root entries and nothing else, each core
    tool ``tool/<name>`` executable beside ``tool/<name>.d/`` with the T-1 controls,
    ``/ctx/bin/ctxterm``, ``/ctx/bin/tsh``, ``/ctx/tool/tsh``, ``tool/tsh.d/config`` holding the
    H-4 settings, and the D-1 bundle; a second run succeeds and keeps a user's file."""
    root = tmp_path / "root"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
    for name in (*CORE_TOOLS, "tsh"):
        endpoint = root / "tool" / name
        assert endpoint.is_file() and os.access(endpoint, os.X_OK), name
    for name in CORE_TOOLS:
        control = root / "tool" / f"{name}.d"
        for entry in CONTROLS:
            assert (control / entry).is_file(), (name, entry)
        assert (control / "hooks" / "pre.d").is_dir(), name
        assert (control / "hooks" / "post.d").is_dir(), name
    for program in ("ctxterm", "tsh"):
        assert os.access(root / "bin" / program, os.X_OK), program
    settings = [
        line
        for line in (root / "tool" / "tsh.d" / "config").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert settings == ["max_loaded_tools=64", "cache_capacity=32", "window_percent=1"]
    docs = root / "shared" / "cortexfs-docs"
    assert (docs / "README.md").is_file()
    assert {p.name for p in (docs / "man").iterdir()} == set(MAN_PAGES.values())
    for forbidden in ("mcp", "audit", "queue"):
        assert not (root / forbidden).exists(), forbidden

    mine = root / "shared" / "mine.txt"
    mine.write_text("user data\n")
    again = ctx_run("bootstrap", "--storage", root)
    assert again.rc == 0, again
    assert mine.read_text() == "user data\n"
    assert {p.name for p in root.iterdir()} == ROOT_ENTRIES


def test_r1_a_non_root_user_without_configuration_gets_the_xdg_default(
    unprivileged_user: UnprivilegedUser,
) -> None:
    """R-1: for a non-root user with no configuration the root is
    ``$XDG_DATA_HOME/cortexfs/storage/current``; the queue commands then find it too."""
    place = new_scratch_dir(SCRATCH, "xdg")
    os.chown(place, unprivileged_user.uid, unprivileged_user.gid)
    env = clean_env(XDG_DATA_HOME=str(place), HOME=str(place))
    ctx = [*CTX_ARGV]
    try:
        made = run_as(unprivileged_user, [*ctx, "bootstrap"], env=env, cwd=place)
        assert made.returncode == 0, made
        root = place / "cortexfs" / "storage" / "current"
        assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
        init = run_as(unprivileged_user, [*ctx, "queue", "init", "--project", "P"], env=env)
        assert init.returncode == 0, init
        dirs = {p.name for p in (root / "shared" / "P" / "queue").iterdir() if p.is_dir()}
        assert dirs == QUEUE_SUBDIRS
        sent = run_as(
            unprivileged_user,
            [*ctx, "queue", "publish", "--project", "P", "-"],
            env=env,
            stdin=json.dumps(request()),
        )
        assert sent.returncode == 0, sent
        job = sent.stdout.strip()
        assert (root / "shared" / "P" / "queue" / "pending" / job).is_file()
    finally:
        shutil.rmtree(place, ignore_errors=True)


# ------------------------------------------------------------------------------------------
# §2, §2.4: the queue CLI line by line


def test_2_queue_init_makes_shared_project_queue_with_exactly_the_six_directories(
    fresh: Path,
) -> None:
    made = on(fresh, "queue", "init", "--project", "P")
    assert made.rc == 0, made
    queue = queue_dir(fresh, "P")
    assert {p.name for p in queue.iterdir() if p.is_dir()} == QUEUE_SUBDIRS
    assert all(not p.is_symlink() for p in queue.iterdir())
    assert {p.name for p in fresh.iterdir()} == ROOT_ENTRIES


def test_24_publish_file_and_stdin_print_j_alone_and_leave_pending_j(
    storage: Path, tmp_path: Path
) -> None:
    """``ctx queue publish --project P [--name J] (FILE | -)  # prints J``."""
    queue = queue_dir(storage)
    from_file = on(
        storage, "queue", "publish", "--project", "proj", request_file(tmp_path, tag="file")
    )
    from_stdin = on(
        storage,
        "queue",
        "publish",
        "--project",
        "proj",
        "-",
        input=json.dumps(request(tag="stdin")),
    )
    named = on(
        storage,
        "queue",
        "publish",
        "--project",
        "proj",
        "--name",
        "nightly",
        request_file(tmp_path, tag="named"),
    )
    suffixed = on(
        storage,
        "queue",
        "publish",
        "--project",
        "proj",
        "--name",
        "weekly.req.json",
        "-",
        input=json.dumps(request()),
    )
    for made in (from_file, from_stdin, named, suffixed):
        assert made.rc == 0, made
        assert made.out.count("\n") == 1 and made.out.endswith("\n"), made
        job = made.out.strip()
        assert job.endswith(SUFFIX), made
        assert (queue / "pending" / job).is_file(), made
    assert named.out == "nightly.req.json\n"
    assert suffixed.out == "weekly.req.json\n"
    stored = json.loads((queue / "pending" / from_file.out.strip()).read_text())
    assert stored["tool"] == "fs.read" and stored["input"] == {"path": "README.md"}
    assert stored["tag"] == "file"
    assert os.listdir(queue / "inbox") == []


@pytest.mark.parametrize("state", ["pending", "claimed", "lease", "done", "failed"])
def test_q1_publish_of_a_name_with_evidence_anywhere_is_eexist_exit_1(
    storage: Path, state: str
) -> None:
    queue = queue_dir(storage)
    job = "taken" + SUFFIX
    if state == "pending":
        publish(storage, "proj", "--name", "taken")
    elif state == "claimed":
        publish(storage, "proj", "--name", "taken")
        assert on(storage, "queue", "claim", "--project", "proj").out == job + "\n"
    elif state == "lease":
        (queue / "lease" / job).mkdir()
    else:
        (queue / state / job).write_text(json.dumps(request()))
        (queue / state / f"{job}.result").write_text(json.dumps({"status": "ok"}))
    before = evidence(storage)
    again = on(
        storage,
        "queue",
        "publish",
        "--project",
        "proj",
        "--name",
        "taken",
        "-",
        input=json.dumps(request(tag="second")),
    )
    assert again.rc == 1, again
    assert "EEXIST" in again.err, again
    assert again.out == "", again
    assert evidence(storage) == before


def test_24_publish_batch_from_a_file_and_from_stdin_prints_each_j(
    storage: Path, tmp_path: Path
) -> None:
    """``ctx queue publish --project P --batch (JSONL_FILE | -)``: one J per request."""
    queue = queue_dir(storage)
    lines = [json.dumps(request(tag=f"b{n}")) for n in range(3)]
    batch = tmp_path / "jobs.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    from_file = on(storage, "queue", "publish", "--project", "proj", "--batch", batch)
    from_stdin = on(
        storage,
        "queue",
        "publish",
        "--project",
        "proj",
        "--batch",
        "-",
        input="\n".join(lines) + "\n",
    )
    names = []
    for made in (from_file, from_stdin):
        assert made.rc == 0, made
        assert len(made.lines()) == 3, made
        names += made.lines()
    assert len(set(names)) == 6
    assert set(os.listdir(queue / "pending")) == set(names)
    tags = sorted(json.loads((queue / "pending" / n).read_text())["tag"] for n in names)
    assert tags == ["b0", "b0", "b1", "b1", "b2", "b2"]


def test_q1_a_request_over_the_size_limit_is_refused_and_the_limit_is_queue_config(
    storage: Path,
) -> None:
    """1 MiB by default, "configurable per queue in ``queue/config``, a key=value data file";
    larger requests are refused (exit 1, §2.4) and leave nothing behind."""
    queue = queue_dir(storage)
    big = json.dumps(request(padding="x" * (1 << 20)))
    refused = on(storage, "queue", "publish", "--project", "proj", "-", input=big)
    assert refused.rc == 1, refused
    assert refused.out == "" and refused.err.strip(), refused
    assert os.listdir(queue / "pending") == [] and os.listdir(queue / "inbox") == []

    config = queue / "config"
    kept = [ln for ln in config.read_text().splitlines() if not ln.startswith("max_request")]
    config.write_text("\n".join([*kept, f"max_request_bytes={4 << 20}"]) + "\n")
    accepted = on(storage, "queue", "publish", "--project", "proj", "-", input=big)
    assert accepted.rc == 0, accepted
    assert os.listdir(queue / "pending") == [accepted.out.strip()]


def test_24_q3_claim_prints_j_alone_and_leases_for_the_calling_process(storage: Path) -> None:
    """``ctx queue claim --project P``: J alone; claimed/J/J and lease/J/worker; the lease
    holder is the parent process (here, this test process) with the Q-3 fields."""
    queue = queue_dir(storage)
    job = publish(storage)
    made = on(storage, "queue", "claim", "--project", "proj")
    assert made.rc == 0, made
    assert made.out == job + "\n"
    assert (queue / "claimed" / job / job).is_file()
    assert not (queue / "pending" / job).exists()
    lease = json.loads((queue / "lease" / job / "worker").read_text())
    assert lease["pid"] == os.getpid()
    assert lease["boot_id"] == boot_id()
    assert lease["pid_ns"] == pid_ns_inode()
    assert lease["host"] == os.uname().nodename
    assert lease["worker"]
    started = psutil.Process().create_time()
    numbers = [v for v in lease.values() if isinstance(v, int | float)]
    assert any(abs(v - started) < 0.02 for v in numbers), (lease, started)
    assert rfc3339(lease["expires_at"]) > rfc3339(lease["claimed_at"])


def test_24_claim_with_worker_pid_and_ttl_writes_them_into_the_lease(
    storage: Path, sleeper: subprocess.Popen
) -> None:
    """``ctx queue claim --project P [--worker ID] [--pid PID] [--ttl S]``."""
    queue = queue_dir(storage)
    job = publish(storage)
    made = on(
        storage,
        "queue",
        "claim",
        "--project",
        "proj",
        "--worker",
        "night-1",
        "--pid",
        str(sleeper.pid),
        "--ttl",
        "45",
    )
    assert made.rc == 0 and made.out == job + "\n", made
    lease = json.loads((queue / "lease" / job / "worker").read_text())
    assert lease["worker"] == "night-1"
    assert lease["pid"] == sleeper.pid
    span = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert abs(span - timedelta(seconds=45)) < timedelta(seconds=1), lease


def test_24_claim_json_prints_one_object_with_name_and_request(storage: Path) -> None:
    job = publish(storage, tag="json")
    made = on(storage, "queue", "claim", "--project", "proj", "--json")
    assert made.rc == 0, made
    answer = made.json()
    assert isinstance(answer, dict)
    assert answer["name"] == job
    assert answer["request"]["tag"] == "json" and answer["request"]["tool"] == "fs.read"


def test_24_claim_on_an_empty_queue_prints_nothing_and_exits_3(storage: Path) -> None:
    before = evidence(storage)
    empty = on(storage, "queue", "claim", "--project", "proj")
    assert empty.rc == 3 and empty.out == "", empty
    as_json = on(storage, "queue", "claim", "--project", "proj", "--json")
    assert as_json.rc == 3, as_json
    assert evidence(storage) == before


def test_24_renew_extends_the_callers_own_lease_and_refuses_anyone_else(storage: Path) -> None:
    """``ctx queue renew --project P J [--ttl S]`` "extends the caller's own lease"."""
    queue = queue_dir(storage)
    job = publish(storage)
    assert on(storage, "queue", "claim", "--project", "proj", "--ttl", "30").rc == 0
    first = json.loads((queue / "lease" / job / "worker").read_text())
    renewed = on(storage, "queue", "renew", "--project", "proj", job, "--ttl", "600")
    assert renewed.rc == 0, renewed
    second = json.loads((queue / "lease" / job / "worker").read_text())
    assert rfc3339(second["expires_at"]) > rfc3339(first["expires_at"]) + timedelta(seconds=500)
    assert second["pid"] == first["pid"]

    # From a shell that is not the holder (the "; echo" keeps sh from exec'ing ctx).
    before = (queue / "lease" / job / "worker").read_bytes()
    command = " ".join([*CTX_ARGV, "queue", "renew", "--project", "proj", job])
    other = subprocess.run(
        ["sh", "-c", f"{command}; echo rc=$?"],
        capture_output=True,
        text=True,
        env=clean_env(CTX_STORAGE=str(storage)),
        timeout=60,
    )
    assert "rc=1" in other.stdout, other
    assert (queue / "lease" / job / "worker").read_bytes() == before


def test_q4_finish_ok_error_with_a_file_stdin_or_nothing_leaves_the_terminal_pair(
    storage: Path, tmp_path: Path
) -> None:
    """``ctx queue finish --project P J (--ok | --error) [RESULT_FILE | -]``: done/J and
    done/J.result (or failed/…), lease and claim gone, the result with the §2.1 fields."""
    queue = queue_dir(storage)
    output_file = tmp_path / "out.json"
    output_file.write_text(json.dumps({"answer": 1}))
    cases = [
        ("--ok", [output_file], None, "done", {"answer": 1}),
        ("--error", ["-"], json.dumps({"why": "broken"}), "failed", {"why": "broken"}),
        ("--ok", [], None, "done", None),
    ]
    for flag, args, stdin, state, expected in cases:
        job = publish(storage)
        assert on(storage, "queue", "claim", "--project", "proj").out == job + "\n"
        made = on(storage, "queue", "finish", "--project", "proj", job, flag, *args, input=stdin)
        assert made.rc == 0, made
        assert (queue / state / job).is_file(), made
        result = json.loads((queue / state / f"{job}.result").read_text())
        assert result["status"] == ("ok" if state == "done" else "error")
        for key in ("output", "worker", "started", "finished"):
            assert key in result, (key, result)
        if expected is not None:
            assert result["output"] == expected
        for gone in ("pending", "claimed", "lease"):
            assert not (queue / gone / job).exists(), (gone, made)
    assert os.listdir(queue / "inbox") == []


@pytest.mark.parametrize(
    "args",
    [
        ("finish", "--project", "proj", "J"),
        ("finish", "--project", "proj", "J", "--ok", "--error"),
        ("claim", "--project", "proj", "--no-such-option"),
        ("status",),
        ("claim", "--project", "proj", "--ttl", "soon"),
    ],
    ids=["finish-without-outcome", "finish-with-both", "unknown-option", "no-project", "ttl"],
)
def test_24_usage_errors_exit_2_and_change_nothing(storage: Path, args: tuple[str, ...]) -> None:
    job = publish(storage)
    assert on(storage, "queue", "claim", "--project", "proj").rc == 0
    args = tuple(job if a == "J" else a for a in args)
    before = evidence(storage)
    made = on(storage, "queue", *args)
    assert made.rc == 2, made
    assert evidence(storage) == before


def test_24_q8_status_counts_states_and_lists_ignored_entries_and_incomplete_pairs(
    storage: Path, tmp_path: Path
) -> None:
    """``ctx queue status --project P [--json]  # counts per state, ignored entries,
    incomplete pairs``; Q-8: dot-files, symlinks and non-regular request files are ``ignored``
    with the reason, and never claimed."""
    queue = queue_dir(storage)
    held = publish(storage)
    assert on(storage, "queue", "claim", "--project", "proj").out == held + "\n"
    for flag in ("--ok", "--error"):
        job = publish(storage)
        assert on(storage, "queue", "claim", "--project", "proj").out == job + "\n"
        assert on(storage, "queue", "finish", "--project", "proj", job, flag).rc == 0
    publish(storage)
    publish(storage)
    outside = tmp_path / "secret"
    outside.write_text("not a job")
    (queue / "pending" / (".hidden" + SUFFIX)).write_text(json.dumps(request()))
    (queue / "pending" / ("link" + SUFFIX)).symlink_to(outside)
    (queue / "pending" / ("dir" + SUFFIX)).mkdir()
    unleased = "unleased" + SUFFIX
    (queue / "claimed" / unleased).mkdir()
    (queue / "claimed" / unleased / unleased).write_text(json.dumps(request()))

    made = on(storage, "queue", "status", "--project", "proj", "--json")
    status = made.json()
    counts = {"pending": 2, "claimed": 1, "done": 1, "failed": 1}
    assert any(all(d.get(k) == v for k, v in counts.items()) for d in dicts_in(status)), status
    text = json.dumps(status)
    for entry in (".hidden" + SUFFIX, "link" + SUFFIX, "dir" + SUFFIX, unleased):
        assert entry in text, entry
    human = on(storage, "queue", "status", "--project", "proj")
    for entry in (".hidden" + SUFFIX, "link" + SUFFIX, "dir" + SUFFIX):
        line = next(ln for ln in human.lines() if entry in ln)
        assert "ignored" in line and line.split(entry, 1)[1].strip(" :"), line
    assert unleased in human.out

    taken = 0
    while on(storage, "queue", "claim", "--project", "proj").rc == 0:
        taken += 1
    assert taken == 2
    assert outside.read_text() == "not a job"
    assert (queue / "pending" / ("link" + SUFFIX)).is_symlink()
    assert (queue / "pending" / (".hidden" + SUFFIX)).is_file()
    assert (queue / "pending" / ("dir" + SUFFIX)).is_dir()


def dicts_in(obj) -> list[dict]:
    """Every JSON object in a parsed document, the document itself included."""
    found = []
    if isinstance(obj, dict):
        found.append(obj)
        for v in obj.values():
            found.extend(dicts_in(v))
    elif isinstance(obj, list):
        for v in obj:
            found.extend(dicts_in(v))
    return found


def test_24_list_by_state_and_show_every_piece_of_evidence(storage: Path) -> None:
    """``ctx queue list --project P [--state S] [--json]`` and
    ``ctx queue show --project P J [--json]  # every piece of evidence for J``."""
    held = publish(storage, "proj", "--name", "held")
    assert on(storage, "queue", "claim", "--project", "proj").out == held + "\n"
    waiting = publish(storage, "proj", "--name", "waiting")
    listed = on(storage, "queue", "list", "--project", "proj", "--state", "pending")
    assert listed.rc == 0 and waiting in listed.lines() and held not in listed.out, listed
    claimed = on(storage, "queue", "list", "--project", "proj", "--state", "claimed", "--json")
    assert claimed.rc == 0, claimed
    assert held in json.dumps(claimed.json()) and waiting not in json.dumps(claimed.json())
    everything = on(storage, "queue", "list", "--project", "proj")
    assert everything.rc == 0 and waiting in everything.out and held in everything.out

    shown = on(storage, "queue", "show", "--project", "proj", held, "--json")
    assert shown.rc == 0, shown
    text = json.dumps(shown.json())
    assert f"claimed/{held}/{held}" in text and f"lease/{held}/worker" in text, text
    human = on(storage, "queue", "show", "--project", "proj", held)
    assert human.rc == 0 and f"lease/{held}/worker" in human.out, human


def test_q6_plain_recover_reports_an_incomplete_pair_exit_1_and_reconcile_requeues_it(
    storage: Path,
) -> None:
    """A claim without a lease: plain ``recover`` reports, changes nothing, exit 1;
    ``--reconcile --dry-run`` changes nothing; ``--reconcile`` moves it back to pending,
    exit 0; a second run changes nothing (I-5)."""
    queue = queue_dir(storage)
    job = "unleased" + SUFFIX
    (queue / "claimed" / job).mkdir()
    (queue / "claimed" / job / job).write_text(json.dumps(request()))
    before = evidence(storage)
    plain = on(storage, "queue", "recover", "--project", "proj")
    assert plain.rc == 1 and job in plain.out + plain.err, plain
    assert evidence(storage) == before
    dry = on(storage, "queue", "recover", "--project", "proj", "--reconcile", "--dry-run")
    assert job in dry.out, dry
    assert evidence(storage) == before
    applied = on(storage, "queue", "recover", "--project", "proj", "--reconcile", "--json")
    assert applied.rc == 0, applied
    assert applied.json()["consistent"] is True
    assert (queue / "pending" / job).is_file()
    assert not (queue / "claimed" / job).exists()
    after = evidence(storage)
    for args in ((), ("--reconcile",)):
        again = on(storage, "queue", "recover", "--project", "proj", *args)
        assert again.rc == 0, again
        assert evidence(storage) == after


def test_q6_a_conflict_is_reported_with_its_evidence_exit_1_and_never_resolved(
    storage: Path,
) -> None:
    queue = queue_dir(storage)
    job = publish(storage, "proj", "--name", "twice")
    (queue / "done" / job).write_text(json.dumps(request()))
    (queue / "done" / f"{job}.result").write_text(json.dumps({"status": "ok"}))
    before = evidence(storage)
    for args in ((), ("--reconcile",)):
        made = on(storage, "queue", "recover", "--project", "proj", *args)
        assert made.rc == 1, made
        said = made.out + made.err
        assert f"pending/{job}" in said and f"done/{job}" in said, made
        assert evidence(storage) == before
    status = on(storage, "queue", "status", "--project", "proj")
    assert status.rc == 1 and job in status.out, status


def test_q5_recover_requeues_only_the_claim_whose_holder_is_gone(
    storage: Path, sleeper: subprocess.Popen
) -> None:
    queue = queue_dir(storage)
    gone = publish(storage, "proj", "--name", "gone")
    taken = on(storage, "queue", "claim", "--project", "proj", "--pid", str(dead_pid()))
    assert taken.out == gone + "\n", taken
    alive = publish(storage, "proj", "--name", "alive")
    taken = on(storage, "queue", "claim", "--project", "proj", "--pid", str(sleeper.pid))
    assert taken.out == alive + "\n", taken
    made = on(storage, "queue", "recover", "--project", "proj")
    assert made.rc == 0, made
    assert (queue / "pending" / gone).is_file()
    assert not (queue / "claimed" / gone).exists() and not (queue / "lease" / gone).exists()
    assert (queue / "claimed" / alive / alive).is_file()
    assert (queue / "lease" / alive / "worker").is_file()


def test_q6_reconcile_rolls_forward_removes_orphans_and_temps_older_than_the_grace(
    storage: Path, sleeper: subprocess.Popen
) -> None:
    queue = queue_dir(storage)
    job = publish(storage, "proj", "--name", "ran")
    claim = on(storage, "queue", "claim", "--project", "proj", "--pid", str(sleeper.pid))
    assert claim.out == job + "\n", claim
    sleeper.kill()
    sleeper.wait()
    outcome = {"status": "ok", "output": 7, "worker": {}, "started": "x", "finished": "y"}
    (queue / "done" / f"{job}.result").write_text(json.dumps(outcome))
    (queue / "claimed" / ("empty" + SUFFIX)).mkdir()
    (queue / "lease" / ("orphan" + SUFFIX)).mkdir()
    (queue / "lease" / ("orphan" + SUFFIX) / "worker").write_text("{}")
    old = queue / "inbox" / "old.tmp"
    old.write_text("half")
    age(old, 3600)
    new = queue / "inbox" / "new.tmp"
    new.write_text("half")

    plain = on(storage, "queue", "recover", "--project", "proj")
    assert plain.rc == 1, plain
    assert not (queue / "pending" / job).exists(), "a job with a result went back to pending"
    made = on(storage, "queue", "recover", "--project", "proj", "--reconcile", "--grace", "60")
    assert made.rc == 0, made
    assert (queue / "done" / job).is_file() and (queue / "done" / f"{job}.result").is_file()
    assert json.loads((queue / "done" / f"{job}.result").read_text())["output"] == 7
    assert os.listdir(queue / "claimed") == [] and os.listdir(queue / "lease") == []
    assert os.listdir(queue / "inbox") == ["new.tmp"]
    assert not (queue / "pending" / job).exists()


def test_24_project_takes_a_queue_path_and_every_command_takes_storage_dir(
    storage: Path, tmp_path: Path
) -> None:
    """All commands take ``--storage DIR`` (or ``CTX_STORAGE``) and ``--project NAME`` (or
    a queue path)."""
    queue = queue_dir(storage)
    bare = clean_env()
    by_path = ctx_run(
        "queue",
        "publish",
        "--project",
        queue,
        "-",
        env=clean_env(),
        input=json.dumps(request(tag="path")),
    )
    assert by_path.rc == 0, by_path
    relative = ctx_run(
        "queue", "status", "--project", "shared/proj/queue", "--json", env=bare, cwd=storage
    )
    assert relative.rc == 0 and relative.json(), relative
    for args in (
        ("queue", "status", "--storage", storage, "--project", "proj", "--json"),
        ("queue", "list", "--project", "proj", "--storage", storage),
        ("--storage", storage, "queue", "show", "--project", "proj", by_path.out.strip()),
    ):
        made = ctx_run(*args, env=bare)
        assert made.rc == 0, made
    assert (
        by_path.out.strip()
        in ctx_run("queue", "list", "--project", "proj", "--storage", storage, env=bare).out
    )
    assert (queue / "pending" / by_path.out.strip()).is_file()


def test_w2_work_drain_max_jobs_and_concurrency_as_written(storage: Path) -> None:
    """``ctx queue work --project P [--drain] [--max-jobs N] [--concurrency N]``: the worker
    takes at most N jobs, each ends as one complete terminal pair (W-1), and ``--drain``
    exits once the queue is empty."""
    queue = queue_dir(storage)
    jobs = [publish(storage, tag=f"w{n}") for n in range(3)]
    first = on(
        storage,
        "queue",
        "work",
        "--project",
        "proj",
        "--drain",
        "--max-jobs",
        "2",
        "--concurrency",
        "2",
        timeout=60,
    )
    assert first.rc == 0, first
    assert len(os.listdir(queue / "pending")) == 1
    rest = on(storage, "queue", "work", "--project", "proj", "--drain", timeout=60)
    assert rest.rc == 0, rest
    for job in jobs:
        states = [s for s in ("done", "failed") if (queue / s / job).is_file()]
        assert len(states) == 1, (job, states)
        result = json.loads((queue / states[0] / f"{job}.result").read_text())
        assert result["status"] == ("ok" if states[0] == "done" else "error"), result
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert os.listdir(queue / sub) == [], sub


# ------------------------------------------------------------------------------------------
# §4: sessions


@pytest.mark.parametrize("where", ["home", "shared"])
def test_s1_s5_session_repair_cuts_the_torn_last_line_of_the_literal_layout(
    storage: Path, where: str
) -> None:
    event = {
        "ts": "2026-06-22T12:00:00Z",
        "type": "tool.call",
        "agent": "coder",
        "session": "default",
        "object": "tool/fs.read",
        "status": "ok",
    }
    line = json.dumps(event, separators=(",", ":")) + "\n"
    if where == "home":
        session = storage / "home" / str(os.getuid()) / "agent" / "coder" / "session" / "default"
        args = ["coder", "--uid", str(os.getuid())]
    else:
        session = storage / "shared" / "proj" / "agent" / "coder" / "session" / "default"
        args = ["coder", "--project", "proj"]
    session.mkdir(parents=True)
    events = session / "events.jsonl"
    events.write_text(line + '{"ts":"2026-06-22T12:00:01Z","ty')
    made = on(storage, "session", "repair", *args)
    assert made.rc == 0, made
    assert events.read_text() == line
    shown = on(storage, "session", "show", *args)
    assert shown.rc == 0 and "tool/fs.read" in shown.out, shown


# ------------------------------------------------------------------------------------------
# §5: policy v0 CLI


def test_p8_policy_check_exit_0_when_valid_else_file_line_einval_on_stderr(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.policy"
    good.write_text(
        "# the examples of the design text\n\n"
        "allow coder_t tool:fs.read execute\n"
        "allow coder_t model:openai/gpt-5.6 use\n"
        "allow coder_t shared:project-a read\n"
        "allow coder_t network:default connect\n"
        "allow parent_t agent:review-1 create\n"
    )
    bad = tmp_path / "bad.policy"
    bad.write_text(
        "allow coder_t tool:fs.read execute\n"
        "allow coder_t agent:* create\n"
        "\n"
        "allow coder_t widget:x use\n"
        "allow coder_t tool:fs.read fly\n"
        "deny coder_t tool:fs.read execute\n"
    )
    ok = ctx_run("policy", "check", good)
    assert ok.rc == 0 and ok.err == "", ok
    failed = ctx_run("policy", "check", good, bad)
    assert failed.rc == 1, failed
    lines = [ln for ln in failed.err.splitlines() if ln.strip()]
    assert [ln.split(": ", 1)[0] for ln in lines] == [f"{bad}:{n}" for n in (2, 4, 5, 6)]
    for ln in lines:
        assert ln.split(": ", 2)[1] == "EINVAL" and ln.split(": ", 2)[2].strip(), ln


def test_p8_policy_query_prints_allow_or_deny_and_every_policy_must_allow(
    tmp_path: Path,
) -> None:
    agent = tmp_path / "agent.policy"
    agent.write_text("allow coder_t tool:fs.read execute\nallow coder_t tool:fs.list execute\n")
    tool = tmp_path / "tool.policy"
    tool.write_text("allow coder_t tool:fs.read execute\n")
    malformed = tmp_path / "malformed.policy"
    malformed.write_text("allow coder_t tool:fs.read\n")

    allowed = ctx_run(
        "policy", "query", "--policy", agent, "--policy", tool, "coder_t", "tool:fs.read", "execute"
    )
    assert (allowed.rc, allowed.out) == (0, "allow\n"), allowed
    one_layer = ctx_run(
        "policy", "query", "--policy", agent, "--policy", tool, "coder_t", "tool:fs.list", "execute"
    )
    assert (one_layer.rc, one_layer.out) == (1, "deny\n"), one_layer
    no_network = ctx_run(
        "policy", "query", "--policy", agent, "coder_t", "network:default", "connect"
    )
    assert (no_network.rc, no_network.out) == (1, "deny\n"), no_network
    for args in (
        ("--policy", agent, "coder_t", "widget:x", "use"),
        ("--policy", agent, "coder_t", "tool:fs.read", "fly"),
        ("--policy", agent, "coder_t", "agent:*", "create"),
        ("--policy", malformed, "coder_t", "tool:fs.read", "execute"),
    ):
        made = ctx_run("policy", "query", *args)
        assert made.rc == 2 and "EINVAL" in made.err, made
        assert made.out not in ("allow\n",), made


# ------------------------------------------------------------------------------------------
# §6: tools and objects


def test_t8a_t4_object_which_resolves_left_to_right_and_skips_non_executables(
    storage: Path, tmp_path: Path
) -> None:
    manifest = write_manifest(tmp_path, "my.echo")
    for tier in ("system", "user"):
        made = on(storage, "object", "install", "--source", storage, manifest, "--tier", tier)
        assert made.rc == 0, made
    system = storage / "tool" / "my.echo"
    user = storage / "home" / str(os.getuid()) / "tool" / "my.echo"
    user_first = clean_env(CTX_PATH=f"{user.parent}:{system.parent}")
    system_first = clean_env(CTX_PATH=f"{system.parent}:{user.parent}")
    assert ctx_run("object", "which", "my.echo", env=user_first).out == f"{user}\n"
    assert ctx_run("object", "which", "my.echo", env=system_first).out == f"{system}\n"
    user.chmod(0o644)
    skipped = ctx_run("object", "which", "my.echo", env=user_first)
    assert (skipped.rc, skipped.out) == (0, f"{system}\n"), skipped
    none = ctx_run("object", "which", "no.such.tool", env=user_first)
    assert none.rc == 1 and none.out == "", none

    listed = on(storage, "object", "list")
    assert listed.rc == 0 and "my.echo" in listed.out and "fs.read" in listed.out, listed
    for tier in ("system", "user"):
        only = on(storage, "object", "list", "--tier", tier)
        assert only.rc == 0 and "my.echo" in only.out, only


def write_manifest(directory: Path, name: str) -> Path:
    (directory / f"{name}.sh").write_text("#!/bin/sh\ncat\n")
    manifest = directory / f"{name}.json"
    manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": name,
                "description": f"The {name} tool.",
                "schema": {"type": "object"},
                "cap": {"side_effects": False, "network": False},
                "exec": f"{name}.sh",
            }
        )
    )
    return manifest


@pytest.mark.parametrize(
    ("tier", "place"),
    [("system", "tool"), ("user", "home/{uid}/tool"), ("shared:proj", "shared/proj/tool")],
)
def test_t8_object_check_and_install_with_source_manifest_tier_as_written(
    storage: Path, tmp_path: Path, tier: str, place: str
) -> None:
    """``ctx object check MANIFEST``; ``ctx object install --source STORAGE MANIFEST --tier
    system|user|shared:<name>``: the tool and its T-1 control directory appear in the tier;
    installing grants nothing (no ``allow`` rule in the tool's policy)."""
    manifest = write_manifest(tmp_path, "my.echo")
    checked = ctx_run("object", "check", manifest)
    assert checked.rc == 0, checked
    made = ctx_run("object", "install", "--source", storage, manifest, "--tier", tier)
    assert made.rc == 0, made
    directory = storage / place.format(uid=os.getuid())
    assert os.access(directory / "my.echo", os.X_OK)
    for entry in CONTROLS:
        assert (directory / "my.echo.d" / entry).is_file(), entry
    assert (directory / "my.echo.d" / "hooks" / "pre.d").is_dir()
    assert (directory / "my.echo.d" / "hooks" / "post.d").is_dir()
    rules = [
        ln
        for ln in (directory / "my.echo.d" / "policy").read_text().splitlines()
        if ln.strip().startswith("allow")
    ]
    assert rules == []
    assert {p.name for p in storage.iterdir()} == ROOT_ENTRIES


def test_t8_object_check_refuses_a_manifest_that_is_not_v2(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, "my.echo")
    document = json.loads(manifest.read_text())
    document["manifest"] = 1
    manifest.write_text(json.dumps(document))
    made = ctx_run("object", "check", manifest)
    assert made.rc != 0, made


# ------------------------------------------------------------------------------------------
# §7: ctx tool and tsh's configuration


def test_h3_h4_ctx_tool_runs_tsh_config_and_refuses_everything_else(
    storage: Path, tmp_path: Path
) -> None:
    shown = on(storage, "tool", "tsh.config")
    assert shown.rc == 0, shown
    for setting in ("max_loaded_tools=64", "cache_capacity=32", "window_percent=1"):
        assert setting in shown.out, shown
    target = tmp_path / "written.txt"
    manifest = write_manifest(tmp_path, "my.echo")
    assert (
        on(storage, "object", "install", "--source", storage, manifest, "--tier", "system").rc == 0
    )
    for name, arg in (
        ("fs.write", json.dumps({"path": str(target), "content": "x"})),
        ("shell.exec", json.dumps({"cmd": f"touch {target}"})),
        ("my.echo", "{}"),
    ):
        refused = on(storage, "tool", name, arg)
        assert refused.rc != 0, refused
        assert refused.out == "", refused
    assert not target.exists()


def test_h1_h2_t4_a_standalone_tsh_finds_tools_by_its_search_path_sources_and_runs_none(
    storage: Path, tmp_path: Path
) -> None:
    """T-4: for a standalone human tsh, ``CTX_PATH=`` in ``$CTX_HOME/.tshrc`` comes before
    the process ``CTX_PATH``; ``.tshrc`` is data, never code.  H-1: no host command from
    ``PATH``.  H-2: it discovers tools but cannot execute them as an agent."""
    marker = tmp_path / "ran"
    manifest = write_manifest(tmp_path, "my.mark")
    (tmp_path / "my.mark.sh").write_text(f"#!/bin/sh\ntouch {marker}\n")
    for tier in ("system", "user"):
        made = on(storage, "object", "install", "--source", storage, manifest, "--tier", tier)
        assert made.rc == 0, made
    tsh = str(storage / "bin" / "tsh")
    system = storage / "tool"
    user = storage / "home" / str(os.getuid()) / "tool"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tshrc").write_text(f"CTX_PATH={user}:{system}\n")

    def run(*args: str, ctx_home: Path | None = home) -> subprocess.CompletedProcess[str]:
        env = clean_env(CTX_PATH=str(system))
        if ctx_home is not None:
            env["CTX_HOME"] = str(ctx_home)
        return subprocess.run(
            [tsh, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
        )

    by_tshrc = run("which", "my.mark")
    assert (by_tshrc.returncode, by_tshrc.stdout) == (0, f"{user / 'my.mark'}\n"), by_tshrc
    by_env = run("which", "my.mark", ctx_home=None)
    assert (by_env.returncode, by_env.stdout) == (0, f"{system / 'my.mark'}\n"), by_env

    coded = tmp_path / "coded"
    coded.mkdir()
    (coded / ".tshrc").write_text(f"CTX_PATH=$(touch {marker})\n")
    run("which", "fs.read", ctx_home=coded)
    refused = run("my.mark")
    assert refused.returncode != 0, refused
    host = run("touch", str(marker))
    assert host.returncode != 0, host
    assert not marker.exists()


# ------------------------------------------------------------------------------------------
# §12: the manual bundle


def test_d1_ctx_man_aliases_the_fallback_and_bootstrap_source_rebuilds_a_stale_bundle(
    storage: Path,
) -> None:
    man = storage / "shared" / "cortexfs-docs" / "man"
    spec_pages = REPO / "docs" / "spec"
    for topic, page in MAN_PAGES.items():
        read = on(storage, "man", topic)
        assert read.rc == 0, read
        assert read.out == (spec_pages / page).read_text(), topic
        assert (man / page).read_bytes() == (spec_pages / page).read_bytes(), page
    readme = storage / "shared" / "cortexfs-docs" / "README.md"
    assert readme.read_bytes() == (spec_pages / "README.md").read_bytes()
    stale = man / "ctx.agent.md"
    stale.chmod(0o644)
    stale.write_text("an old page\n")
    (man / "ctx.tool.md").unlink()
    fallback = on(storage, "man", "tool")
    assert fallback.rc == 0 and fallback.out == (spec_pages / "ctx.tool.md").read_text()
    rebuilt = on(storage, "bootstrap", REPO)
    assert rebuilt.rc == 0, rebuilt
    assert stale.read_bytes() == (spec_pages / "ctx.agent.md").read_bytes()
    assert (man / "ctx.tool.md").read_bytes() == (spec_pages / "ctx.tool.md").read_bytes()
    assert {p.name for p in man.iterdir()} == set(MAN_PAGES.values())


# ------------------------------------------------------------------------------------------
# §10: ctxmcp as printed

# A stdio MCP server answering with the protocol version it is started with; it records the
# initialize request it received.
SERVER = r"""
import json, sys
version, record = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        open(record, "w").write(json.dumps(message))
        answer = {"protocolVersion": version, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "gh", "version": "1"}}
    elif message["method"] == "tools/list":
        answer = {"tools": [
            {"name": "search_issues", "description": "Search issues.",
             "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
            {"name": "bad/name", "description": "Illegal.", "inputSchema": {"type": "object"}},
        ]}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"],
                          "error": {"code": -32601, "message": "no"}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": answer}), flush=True)
"""


def ctxmcp(*args: str | os.PathLike, env: dict[str, str], cwd: Path) -> Run:
    argv = [str(CTXMCP), *map(str, args)]
    proc = subprocess.run(argv, input=b"", capture_output=True, env=env, cwd=cwd, timeout=60)
    return Run(argv[1:], proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def mcp_config(directory: Path, version: str) -> Path:
    (directory / "server.py").write_text(SERVER)
    config = directory / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "github": {
                        "command": sys.executable,
                        "args": [
                            str(directory / "server.py"),
                            version,
                            str(directory / "initialize.json"),
                        ],
                        "env": {"GITHUB_TOKEN": "s3cret-token-value"},
                    }
                }
            }
        )
    )
    return config


def test_m1_m3_m4_the_printed_list_and_project_lines_then_check_and_install(
    storage: Path, tmp_path: Path
) -> None:
    config = mcp_config(tmp_path, "2025-11-25")
    env = clean_env(CTX_STORAGE=str(storage))
    before = snapshot(storage)
    listed = ctxmcp("list", "--config", config, "--server", "github", env=env, cwd=tmp_path)
    assert listed.rc == 0, listed
    assert "github.search_issues" in listed.out
    asked = json.loads((tmp_path / "initialize.json").read_text())
    assert asked["params"]["protocolVersion"] == "2025-11-25"

    projected = ctxmcp(
        "project",
        "--config",
        config,
        "--runtime-config",
        "/workspace/.mcp.json",
        "--server",
        "github",
        "--out",
        "./mcp-manifests",
        env=env,
        cwd=tmp_path,
    )
    assert "bad/name" in projected.err, projected
    out = tmp_path / "mcp-manifests"
    assert [p.name for p in out.iterdir()] == ["github.search_issues.manifest.json"]
    candidate = out / "github.search_issues.manifest.json"
    document = json.loads(candidate.read_text())
    assert document["manifest"] == 2 and document["name"] == "github.search_issues"
    assert document["mcp"] == {
        "transport": "stdio",
        "config": "/workspace/.mcp.json",
        "server": "github",
        "tool": "search_issues",
    }
    assert "s3cret-token-value" not in candidate.read_text()
    assert snapshot(storage) == before

    checked = ctx_run(
        "object", "check", "./mcp-manifests/github.search_issues.manifest.json", cwd=tmp_path
    )
    assert checked.rc == 0, checked
    installed = ctx_run(
        "object",
        "install",
        "--source",
        storage,
        "./mcp-manifests/github.search_issues.manifest.json",
        "--tier",
        "system",
        cwd=tmp_path,
    )
    assert installed.rc == 0, installed
    control = storage / "tool" / "github.search_issues.d"
    for entry in ("schema", "policy", "status", "log"):
        assert (control / entry).is_file(), entry
    assert {p.name for p in storage.iterdir()} == ROOT_ENTRIES
    assert not (storage / "mcp").exists()
    assert "s3cret-token-value" not in json.dumps(snapshot(storage), default=repr)


@pytest.mark.parametrize(
    ("version", "accepted"),
    [*((v, True) for v in STABLE_MCP_VERSIONS), ("2026-01-01", False), ("draft", False)],
)
def test_m2_only_the_four_stable_versions_are_accepted(
    tmp_path: Path, version: str, accepted: bool
) -> None:
    config = mcp_config(tmp_path, version)
    made = ctxmcp("list", "--config", config, "--server", "github", env=clean_env(), cwd=tmp_path)
    assert (made.rc == 0) == accepted, made
    assert ("github.search_issues" in made.out) == accepted, made


# ------------------------------------------------------------------------------------------
# §6 T-2 and §13 F-1: through a real mount


@contextlib.contextmanager
def mounted(root: Path, *options: str) -> Iterator[tuple[Path, subprocess.Popen]]:
    """``ctx mount MOUNTPOINT [OPTIONS]`` (CTX_STORAGE names the root) running until the
    block ends, then ``ctx umount MOUNTPOINT``."""
    place = new_scratch_dir(SCRATCH, "mnt")
    mountpoint = place / "ctx"
    mountpoint.mkdir()
    proc = subprocess.Popen(
        [*CTX_ARGV, "mount", str(mountpoint), *options],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(root)),
        start_new_session=True,
    )
    try:
        mounted_in_time = wait_for(lambda: mounted_at(mountpoint) or proc.poll() is not None)
        assert mounted_in_time and mounted_at(mountpoint), proc.stderr.read().decode()
        yield mountpoint, proc
    finally:
        if mounted_at(mountpoint):
            ctx_run("umount", mountpoint)
        if mounted_at(mountpoint):
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        shutil.rmtree(place, ignore_errors=True)


@needs_fuse_as_root
def test_t2_f1_the_literal_tool_invocations_through_ctx_mount_then_ctx_umount(
    storage: Path, tmp_path: Path
) -> None:
    """``/ctx/tool/fs.read '{"path":"README.md"}'`` and
    ``echo '{"cmd":"pwd"}' | /ctx/tool/shell.exec`` through ``ctx mount MOUNTPOINT``; the
    mount shows exactly the six root entries; ``ctx umount`` unmounts and the mount process
    exits."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("the readme of the work tree\n")
    with mounted(storage) as (ctx, proc):
        assert {p.name for p in ctx.iterdir()} == ROOT_ENTRIES
        read = subprocess.run(
            [str(ctx / "tool" / "fs.read"), '{"path":"README.md"}'],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert read.returncode == 0, read
        assert "the readme of the work tree" in read.stdout, read
        pwd = subprocess.run(
            f'echo \'{{"cmd":"pwd"}}\' | {ctx}/tool/shell.exec',
            shell=True,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pwd.returncode == 0, pwd
        assert str(work) in pwd.stdout, pwd
        for path in ("bin/ctxterm", "bin/tsh", "tool/tsh", "tool/tsh.d/config"):
            assert (ctx / path).exists(), path
        down = ctx_run("umount", ctx)
        assert down.rc == 0, down
        assert not mounted_at(ctx)
        proc.wait(timeout=15)


@needs_fuse_as_root
def test_f1_sigterm_to_ctx_mount_unmounts_cleanly(storage: Path) -> None:
    with mounted(storage) as (ctx, proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        assert not mounted_at(ctx)


@needs_fuse_as_root
def test_f1_ctx_mount_mountpoint_as_agent_lists_only_what_both_policies_allow(
    searchable_storage: Path,
) -> None:
    """``ctx mount MOUNTPOINT --as AGENT``: the tool the agent's and the tool's policy both
    allow is listed, one only the agent's policy names is not (T-5, P-6)."""
    root = searchable_storage
    made = on(
        root,
        "agent",
        "create",
        "-",
        input=json.dumps(
            {
                "name": "coder",
                "label": "coder_t",
                "model": [],
                "tools": ["fs.read", "fs.list"],
                "shared": {},
                "mount": [],
            }
        ),
    )
    assert made.rc == 0, made
    with (root / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:fs.read execute\n")
    with mounted(root, "--as", "coder") as (ctx, _proc):
        assert {p.name for p in ctx.iterdir()} <= ROOT_ENTRIES
        tools = {p.name for p in (ctx / "tool").iterdir()}
        assert "fs.read" in tools and "fs.list" not in tools and "shell.exec" not in tools
