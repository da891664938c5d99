"""SPEC §1–§3 read as a contract: the storage root and its resolution order (R-1), the root
ABI and bootstrap (R-2, R-5), object names (R-3), the shared queue and its command line
(§2.1–§2.4, Q-1…Q-9, I-1…I-5) and the worker (§3, W-1…W-4).

Every expectation below comes from a sentence of SPEC.md (or of the original design text it
restates); each test quotes the requirement it checks.  Everything goes through the installed
``ctx`` in real processes, on real directories; the files of the queue are looked at directly,
since the directory layout is the protocol."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    SUFFIX,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    find_values,
    is_object_name,
    new_scratch_dir,
    request,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
TOOL_CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log")
MAN_PAGES = ("agent", "tool", "model", "coreutils", "root-abi", "session", "provider")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
PID_NS = os.stat("/proc/self/ns/pid").st_ino
OTHER_BOOT = "00000000-0000-4000-8000-000000000001"
MIB = 1024 * 1024
AGENT = "wk"


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory under this file's scratch top, removed afterwards."""
    made = new_scratch_dir(TOP)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process that a claim may name as its lease holder (``--pid``)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def claim_for_dead_holder(queue: QueueCLI, *args: str) -> str:
    """Claim the next job on behalf of a process that then exits: its lease holder is gone."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        job = queue.claim("--pid", str(proc.pid), *args)
    finally:
        proc.kill()
        proc.wait()
    return job


def put_in_claimed(queue: QueueCLI, job: str) -> None:
    """``claimed/J/J`` with no lease: what a claim leaves when it stops before its lease."""
    (queue.dir / "claimed" / job).mkdir()
    os.rename(queue.dir / "pending" / job, queue.dir / "claimed" / job / job)


def epoch(value) -> float:
    """A lease time stamp as seconds since the epoch: a number, or an RFC 3339 string."""
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def edit_lease(queue: QueueCLI, job: str, **changes) -> None:
    """Rewrite ``lease/J/worker`` with ``changes`` (what a lease written on another host, or
    before a reboot, looks like), atomically, as any writer of a lease must."""
    path = queue.dir / "lease" / job / "worker"
    lease = json.loads(path.read_text())
    lease.update(changes)
    temp = path.with_name("worker.edit")
    temp.write_text(json.dumps(lease))
    os.replace(temp, path)


def parse_json_output(text: str):
    """stdout of a ``--json`` command: one JSON document, or JSON lines (a list of them)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def queue_holds(queue: QueueCLI, **expected: set[str]) -> None:
    """Each state directory holds exactly what ``expected`` names (nothing when not named)."""
    for sub in sorted(QUEUE_SUBDIRS):
        assert queue.entries(sub) == expected.get(sub, set()), sub


def queue_subdirs(queue_dir: Path) -> set[str]:
    return {p.name for p in queue_dir.iterdir() if p.is_dir()}


def make_agent(storage: Path, name: str, tools: list[str], *options: str) -> None:
    """``ctx agent create`` (A-3) of ``name`` with ``tools``, plus the tool layer of P-6."""
    req = {"name": name, "label": f"{name}_t", "tools": tools}
    made = ctx_run("agent", "create", "--storage", storage, *options, "-", input=json.dumps(req))
    assert made.rc == 0, made
    for tool in tools:
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {name}_t tool:{tool} execute\n")


def shell_job(cmd: str) -> dict:
    req = request("shell.exec")
    req["input"] = {"cmd": cmd}
    return req


def work(queue: QueueCLI, *args: str, agent: str = AGENT):
    return queue.run("work", "--agent", agent, *args, timeout=90)


def start_worker(queue: QueueCLI, *args: str, agent: str = AGENT) -> subprocess.Popen:
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", agent, *args]
    return subprocess.Popen(
        argv,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def queue_env(queue: QueueCLI) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(queue.storage))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


@pytest.fixture
def work_queue(searchable_storage: Path) -> QueueCLI:
    """Queue ``proj`` of a root an agent's uid may search, with agent ``wk`` allowed
    ``shell.exec`` in both layers of P-6."""
    make_agent(searchable_storage, AGENT, ["shell.exec"])
    return QueueCLI(searchable_storage, "proj")


@pytest.fixture
def outbox(scratch: Path) -> Path:
    """A directory every uid may write: where jobs leave their traces."""
    out = scratch / "out"
    out.mkdir()
    out.chmod(0o1777)
    return out


# ------------------------------------------------------------------------------


def test_storage_option_overrides_the_environment(storage: Path, scratch: Path) -> None:
    """R-1: "CTX_STORAGE or --storage DIR overrides it everywhere"; §2.4: "All commands take
    --storage DIR (or CTX_STORAGE)".  Given both, the option names the root: the commands
    act on that root and CTX_STORAGE's is never made."""
    by_env = scratch / "env-root"
    env = clean_env(CTX_STORAGE=str(by_env))
    common = ("--storage", storage, "--project", "proj")
    published = ctx_run("queue", "publish", *common, "-", input=json.dumps(request()), env=env)
    assert published.rc == 0, published
    job = published.out.strip()
    claimed = ctx_run("queue", "claim", *common, env=env)
    assert claimed.rc == 0 and claimed.out.strip() == job, claimed
    finished = ctx_run("queue", "finish", *common, job, "--ok", "-", input="{}", env=env)
    assert finished.rc == 0, finished
    queue_dir = storage / "shared" / "proj" / "queue"
    assert {p.name for p in (queue_dir / "done").iterdir()} == {job, f"{job}.result"}
    assert not by_env.exists()


def test_environment_names_the_root_and_init_makes_the_queue(storage: Path) -> None:
    """R-1: "CTX_STORAGE ... overrides it everywhere": without --storage, the queue of
    ``ctx queue init --project P`` is CTX_STORAGE/shared/P/queue.  §2: the queue "lives at
    shared/<project>/queue/ with exactly these subdirectories: inbox/ pending/ lease/
    claimed/ done/ failed/", all empty at first; X-1: the shared space holds tool/, data/,
    queue/; R-2: nothing new at the root."""
    made = ctx_run("queue", "init", "--project", "by-env", env=clean_env(CTX_STORAGE=str(storage)))
    assert made.rc == 0, made
    queue_dir = storage / "shared" / "by-env" / "queue"
    assert queue_subdirs(queue_dir) == QUEUE_SUBDIRS
    assert all(not any((queue_dir / sub).iterdir()) for sub in QUEUE_SUBDIRS)
    assert {"tool", "data", "queue"} <= set(os.listdir(storage / "shared" / "by-env"))
    assert set(os.listdir(storage)) == ROOT_ENTRIES


def test_non_root_default_root_is_under_xdg_data_home(
    storage: Path, scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1: "For a non-root user with no configuration the embedded default is
    $XDG_DATA_HOME/cortexfs/storage/current (~/.local/share/...)".  Both candidate roots
    exist (copies of a bootstrapped root, the user's own); each run picks the one R-1 names."""
    home = scratch / "home"
    xdg_root = home / "xdg" / "cortexfs" / "storage" / "current"
    local_root = home / ".local" / "share" / "cortexfs" / "storage" / "current"
    for root in (xdg_root, local_root):
        root.parent.mkdir(parents=True)
        shutil.copytree(storage, root, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, unprivileged_user.uid, unprivileged_user.gid)
    base_env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    init = [*CTX_ARGV, "queue", "init", "--project"]
    with_xdg = run_as(
        unprivileged_user, [*init, "via-xdg"], env={**base_env, "XDG_DATA_HOME": str(home / "xdg")}
    )
    assert with_xdg.returncode == 0, with_xdg
    without_xdg = run_as(unprivileged_user, [*init, "via-home"], env=base_env)
    assert without_xdg.returncode == 0, without_xdg
    assert queue_subdirs(xdg_root / "shared" / "via-xdg" / "queue") == QUEUE_SUBDIRS
    assert queue_subdirs(local_root / "shared" / "via-home" / "queue") == QUEUE_SUBDIRS
    assert not (local_root / "shared" / "via-xdg").exists()
    assert not (xdg_root / "shared" / "via-home").exists()


def test_root_default_root_is_var_lib(scratch: Path) -> None:
    """R-1: "The system default is /var/lib/cortexfs/storage/current" (the XDG default is for
    a non-root user only).  Run as root in a private mount namespace whose /var/lib is an
    empty tmpfs, so the machine's own default root is not touched."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    xdg = scratch / "xdg"
    script = (
        "mount -t tmpfs tmpfs /var/lib || exit 99\n"
        f'"{CTX_ARGV[0]}" queue init --project p >/dev/null || exit 98\n'
        "ls /var/lib/cortexfs/storage/current/shared/p/queue\n"
    )
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(scratch), "XDG_DATA_HOME": str(xdg)}
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if done.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done
    assert set(done.stdout.split()) >= QUEUE_SUBDIRS
    assert not xdg.exists()


# ------------------------------------------------------------------------------


def test_bootstrap_makes_the_root_abi_core_tools_config_and_manual(storage: Path) -> None:
    """R-2: the root has "exactly these root entries: bin/, tool/, agent/, model/, home/,
    shared/ ... no mcp/, no audit/, no queue/"; R-5: bootstrap creates "the core tools
    (fs.read, fs.list, fs.stat, fs.write, shell.exec, tsh.config ...), tool/tsh.d/config, and
    the docs bundle shared/cortexfs-docs/"; T-1: "tool/<name> (executable) plus
    tool/<name>.d/ with the controls name, description, schema, cap, policy, status, log,
    hooks/pre.d/, hooks/post.d/"; H-4: max_loaded_tools=64, cache_capacity=32,
    window_percent=1; D-1: README.md and the seven man pages.  ``storage`` is what
    ``ctx bootstrap --storage DIR`` made, plus ``ctx queue init --project proj``."""
    root = storage
    assert set(os.listdir(root)) == ROOT_ENTRIES
    assert all((root / e).is_dir() and not (root / e).is_symlink() for e in ROOT_ENTRIES)
    for tool in CORE_TOOLS:
        endpoint = root / "tool" / tool
        assert endpoint.is_file() and os.access(endpoint, os.X_OK), tool
        controls = root / "tool" / f"{tool}.d"
        for control in TOOL_CONTROLS:
            assert (controls / control).exists(), (tool, control)
        assert (controls / "hooks" / "pre.d").is_dir(), tool
        assert (controls / "hooks" / "post.d").is_dir(), tool
    settings = {}
    for line in (root / "tool" / "tsh.d" / "config").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    assert settings == {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}
    docs = root / "shared" / "cortexfs-docs"
    assert (docs / "README.md").is_file()
    assert {f"ctx.{page}.md" for page in MAN_PAGES} <= set(os.listdir(docs / "man"))


def test_bootstrap_repairs_keeps_user_data_and_is_idempotent(storage: Path) -> None:
    """R-5: "ctx bootstrap [SOURCE] creates or repairs a storage root ... It is idempotent
    and never destroys user data": run on a root with a core tool, the tsh configuration and
    a root directory missing, and holding an administrator's policy rule, a data file and
    queued jobs, it puts back what is missing and leaves the rest byte for byte; run again,
    it changes nothing."""
    settled = snapshot(storage)
    queue = QueueCLI(storage, "proj")
    claimed, pending = queue.drop("claimed"), queue.drop("kept")
    assert queue.claim() == claimed
    with (storage / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write("allow reader_t tool:fs.read execute\n")
    (storage / "shared" / "proj" / "data" / "notes.txt").write_text("mine\n")
    mine = {
        k: v
        for k, v in snapshot(storage).items()
        if k.startswith(("shared/proj", "tool/fs.read.d"))
    }
    (storage / "tool" / "fs.stat").unlink()
    (storage / "tool" / "tsh.d" / "config").unlink()
    (storage / "model").rmdir()
    repaired = ctx_run("bootstrap", "--storage", storage)
    assert repaired.rc == 0, repaired
    after = snapshot(storage)
    for path in ("tool/fs.stat", "tool/tsh.d/config", "model"):
        assert after[path] == settled[path], path
    for path, entry in mine.items():
        assert after.get(path) == entry, path
    assert set(os.listdir(storage)) == ROOT_ENTRIES
    assert queue.state(pending) == "pending" and queue.state(claimed) == "claimed"
    again = ctx_run("bootstrap", "--storage", storage)
    assert again.rc == 0, again
    assert snapshot(storage) == after


# ------------------------------------------------------------------------------


def test_legal_job_names_are_accepted(queue: QueueCLI) -> None:
    """R-3: object names are "1 to 64 bytes of ASCII [A-Za-z0-9._-], first byte
    [A-Za-z0-9]"; §2.4: "--name J may be given without the .req.json suffix, which is then
    added" (and a name that has it keeps it)."""
    expected = set()
    for name in ("a", "Z9.y_z-1", "0" + "b" * 54, "already.req.json"):
        job = name if name.endswith(SUFFIX) else name + SUFFIX
        published = queue.run("publish", "--name", name, "-", input=json.dumps(request()))
        assert published.rc == 0, published
        assert published.out == job + "\n"
        expected.add(job)
    queue_holds(queue, pending=expected)


def test_illegal_job_names_are_refused(queue: QueueCLI) -> None:
    """R-3: first byte [A-Za-z0-9], only [A-Za-z0-9._-], at most 64 bytes, no /, "Anything
    else is rejected with EINVAL".  Nothing is published, no temp file is left in inbox/."""
    for name in (".hidden", "a b", "caf\u00e9", "a/b", "", "n" * 65):
        published = queue.run("publish", f"--name={name}", "-", input=json.dumps(request()))
        assert published.rc in (1, 2), published
        assert "EINVAL" in published.err, published
        assert published.out == ""
    queue_holds(queue)


def test_project_names_follow_the_object_name_rules(storage: Path) -> None:
    """R-3: shared space names are object names, "not ending in .d (that suffix is the
    control directory)", 1 to 64 bytes; "Anything else is rejected with EINVAL" and no
    space appears.  The longest legal name gets its queue."""
    before = set(os.listdir(storage / "shared"))
    for project in ("x.d", ".hidden", "a b", "p" * 65):
        made = ctx_run("queue", "init", f"--project={project}", "--storage", storage)
        assert made.rc in (1, 2), made
        assert "EINVAL" in made.err, made
    assert set(os.listdir(storage / "shared")) == before
    longest = "P" * 64
    made = ctx_run("queue", "init", "--project", longest, "--storage", storage)
    assert made.rc == 0, made
    assert queue_subdirs(storage / "shared" / longest / "queue") == QUEUE_SUBDIRS


# ------------------------------------------------------------------------------ §2, Q-1


def test_publish_prints_the_name_alone_and_leaves_only_pending(
    queue: QueueCLI, scratch: Path
) -> None:
    """Q-1, §2.4: "In text mode publish ... print[s] the job name J alone on its own line (and
    nothing else on stdout)"; the request lands in pending/J as one JSON object holding what
    was published (extra fields kept, §2.1); the staging temp file is gone.  Without --name,
    J is a fresh "object name that ends in .req.json" (§2.1)."""
    req = request(tag="extra-field", number=7)
    path = scratch / "req.json"
    path.write_text(json.dumps(req))
    published = queue.run("publish", "--name", "first", path)
    assert published.rc == 0, published
    assert published.out == "first.req.json\n"
    queue_holds(queue, pending={"first.req.json"})
    stored = json.loads((queue.dir / "pending" / "first.req.json").read_text("utf-8"))
    assert isinstance(stored, dict)
    for key in ("tool", "input", "tag", "number"):
        assert stored[key] == req[key], key
    unnamed = [queue.publish(), queue.publish()]
    assert unnamed[0] != unnamed[1]
    for job in unnamed:
        assert job.endswith(SUFFIX) and is_object_name(job), job
    queue_holds(queue, pending={"first.req.json", *unnamed})


def test_publish_refuses_a_name_with_evidence_anywhere(queue: QueueCLI) -> None:
    """Q-1: "Publishing a name that already has evidence anywhere (pending, claimed, lease,
    done, failed) is refused (EEXIST), never overwritten"; §2.4: exit 1 "operation
    refused".  A result alone is evidence too."""
    d = queue.dir
    queue.drop("in-pending")
    (d / "claimed" / "in-claimed.req.json").mkdir()
    (d / "lease" / "in-lease.req.json").mkdir()
    (d / "lease" / "in-lease.req.json" / "worker").write_text("{}")
    queue.terminal("in-done", "done")
    queue.terminal("in-failed", "failed")
    (d / "done" / "result-only.req.json.result").write_text(json.dumps({"status": "ok"}))
    before = snapshot(d)
    for name in ("in-pending", "in-claimed", "in-lease", "in-done", "in-failed", "result-only"):
        again = queue.run("publish", "--name", name, "-", input=json.dumps(request(tag="new")))
        assert again.rc == 1, again
        assert "EEXIST" in again.err, again
        assert again.out == ""
    assert snapshot(d) == before


def test_publish_refuses_what_is_not_one_json_object(queue: QueueCLI) -> None:
    """§2.1: "A request file is a regular file holding one JSON object (UTF-8)": an array or
    text that is not JSON is not published."""
    for text in ("[1, 2]", "not json"):
        published = queue.run("publish", "-", input=text)
        assert published.rc in (1, 2), published
        assert published.out == ""
    queue_holds(queue)


def _request_of_size(size: int) -> str:
    base = json.dumps({"tool": "fs.read", "input": {"pad": ""}})
    text = json.dumps({"tool": "fs.read", "input": {"pad": "a" * (size - len(base))}})
    assert len(text) == size
    return text


def test_publish_refuses_requests_over_one_mebibyte(queue: QueueCLI) -> None:
    """§2.1: "size limit 1 MiB ... larger requests are refused with a clear error"; §2.4:
    exit 1 "operation refused".  A request well under the limit is published."""
    too_big = queue.run("publish", "--name", "big", "-", input=_request_of_size(MIB + 1))
    assert too_big.rc == 1, too_big
    assert too_big.err.strip() and too_big.out == ""
    queue_holds(queue)
    fits = queue.run("publish", "--name", "fits", "-", input=_request_of_size(MIB - 4096))
    assert fits.rc == 0, fits
    assert queue.entries("pending") == {"fits" + SUFFIX}


def test_publish_batch_prints_each_name(queue: QueueCLI, scratch: Path) -> None:
    """§2.4: "publish --project P --batch (JSONL_FILE | -) # one request per line, one group
    commit; prints each J": a file of three lines and stdin of two give five pending jobs,
    each name printed alone on its own line."""
    batch = scratch / "batch.jsonl"
    batch.write_text("".join(json.dumps(request(n=i)) + "\n" for i in range(3)))
    from_file = queue.run("publish", "--batch", batch)
    assert from_file.rc == 0, from_file
    lines = "".join(json.dumps(request(n=i)) + "\n" for i in (3, 4))
    from_stdin = queue.run("publish", "--batch", "-", input=lines)
    assert from_stdin.rc == 0, from_stdin
    names = from_file.out.splitlines() + from_stdin.out.splitlines()
    assert len(names) == 5 and len(set(names)) == 5
    assert all(is_object_name(n) and n.endswith(SUFFIX) for n in names)
    queue_holds(queue, pending=set(names))
    tags = {json.loads((queue.dir / "pending" / n).read_text())["n"] for n in names}
    assert tags == {0, 1, 2, 3, 4}


# ------------------------------------------------------------------------------


def test_claim_on_an_empty_queue_prints_nothing_and_exits_3(queue: QueueCLI) -> None:
    """§2.4: claim "prints J, or nothing with exit 3 (queue empty)"."""
    claimed = queue.run("claim")
    assert claimed.rc == 3, claimed
    assert claimed.out == ""
    queue_holds(queue)


def test_claim_moves_the_request_and_writes_the_lease(queue: QueueCLI) -> None:
    """§2.1 claimed = "claimed/J/J and lease/J/worker"; Q-2: "The winner renames pending/J
    to claimed/J/J"; §2.4: claim prints J alone.  The request bytes are unchanged by the
    move; the staging directory is left empty."""
    job = queue.drop("move-me")
    original = (queue.dir / "pending" / job).read_bytes()
    claimed = queue.run("claim")
    assert claimed.rc == 0, claimed
    assert claimed.out == job + "\n"
    queue_holds(queue, claimed={job}, lease={job})
    assert os.listdir(queue.dir / "claimed" / job) == [job]
    assert os.listdir(queue.dir / "lease" / job) == ["worker"]
    assert (queue.dir / "claimed" / job / job).read_bytes() == original
    assert stat.S_ISREG(os.lstat(queue.dir / "lease" / job / "worker").st_mode)


def test_the_lease_identifies_the_calling_process(queue: QueueCLI) -> None:
    """Q-3: lease/J/worker is "one JSON object identifying the holder: worker id, host name,
    boot_id (/proc/sys/kernel/random/boot_id), pid_ns (the inode of /proc/self/ns/pid), pid,
    the process start time (psutil create_time), claimed_at, expires_at"; §2.4: "the lease
    holder is the parent process" of ``ctx queue claim`` (here, this test process)."""
    job = queue.drop("mine")
    assert queue.claim() == job
    lease = queue.lease(job)
    for key in ("worker", "host", "boot_id", "pid_ns", "pid", "claimed_at", "expires_at"):
        assert key in lease, key
    assert lease["host"] == socket.gethostname()
    assert lease["boot_id"] == BOOT_ID
    assert int(lease["pid_ns"]) == PID_NS
    assert int(lease["pid"]) == os.getpid()
    started = psutil.Process().create_time()
    numbers = [v for v in lease.values() if isinstance(v, int | float) and not isinstance(v, bool)]
    assert any(abs(v - started) < 1.0 for v in numbers), lease
    assert epoch(lease["expires_at"]) > epoch(lease["claimed_at"])


def test_claim_options_pid_worker_and_ttl(queue: QueueCLI, holder: subprocess.Popen) -> None:
    """§2.4: "claim ... [--worker ID] [--pid PID] [--ttl S]": "the lease holder is the parent
    process unless --pid PID names another; --ttl SECONDS sets expires_at"; Q-3: the lease
    records the worker id."""
    job = queue.drop("theirs")
    claimed = queue.run("claim", "--worker", "builder-7", "--pid", str(holder.pid), "--ttl", "120")
    assert claimed.rc == 0 and claimed.out == job + "\n", claimed
    lease = queue.lease(job)
    assert lease["worker"] == "builder-7"
    assert int(lease["pid"]) == holder.pid
    assert abs(epoch(lease["expires_at"]) - epoch(lease["claimed_at"]) - 120) < 2


def test_claim_from_a_shell_leases_for_that_shell(queue: QueueCLI, outbox: Path) -> None:
    """§2.4: "ctx queue claim run from a shell leases on behalf of the calling process: the
    lease holder is the parent process ... ctx queue renew --project P J extends the
    caller's own lease"; Q-5/Q-6: recover leaves the claim while that shell lives and
    requeues it once the shell is gone."""
    job = queue.drop("scripted")
    release, said = outbox / "release", outbox / "said"
    ctx = CTX_ARGV[0]
    script = (
        f'J=$("{ctx}" queue claim --project {queue.project}) || exit 7\n'
        f'"{ctx}" queue renew --project {queue.project} "$J" --ttl 900 >/dev/null || exit 8\n'
        f'echo "$$ $J" > "{said}.tmp" && mv "{said}.tmp" "{said}"\n'
        f'i=0; while [ ! -e "{release}" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n'
    )
    shell = subprocess.Popen(["sh", "-c", script], env=queue_env(queue))
    try:
        assert wait_for(said.exists, seconds=60), f"the shell said nothing (exit {shell.poll()})"
        shell_pid, claimed = said.read_text().split()
        assert claimed == job
        lease = queue.lease(job)
        assert int(lease["pid"]) == int(shell_pid) == shell.pid
        assert abs(epoch(lease["expires_at"]) - time.time() - 900) < 60
        assert queue.run("recover").rc == 0
        assert queue.state(job) == "claimed"
        release.touch()
        assert shell.wait(timeout=60) == 0
    finally:
        if shell.poll() is None:
            shell.kill()
        shell.wait()
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    queue_holds(queue, pending={job})


def test_claim_json_is_one_object_with_name_and_request(queue: QueueCLI) -> None:
    """§2.4: "with --json, claim prints one object with at least name and request"."""
    req = request(tag="json-claim")
    job = queue.drop("as-json", req)
    claimed = queue.run("claim", "--json")
    assert claimed.rc == 0, claimed
    answer = json.loads(claimed.out)
    assert answer["name"] == job
    for key in ("tool", "input", "tag"):
        assert answer["request"][key] == req[key], key


def test_claim_takes_the_oldest_pending_job_first(queue: QueueCLI) -> None:
    """Q-9: "claims take the oldest pending job first (by publish time, name as
    tie-break)".  The job published a second before another is claimed first, though its
    name sorts last."""
    older = queue.publish(name="zz-older")
    time.sleep(1.1)
    newer = queue.publish(name="aa-newer")
    assert queue.claim() == older
    assert queue.claim() == newer


def test_concurrent_claims_never_share_a_job(queue: QueueCLI) -> None:
    """Q-2: "mkdir claimed/J is the single exclusive arbitration point ... Losing is not an
    error"; I-4: "At most one live worker holds J at a time".  Eight claimers race for five
    jobs: five get five different jobs, the other three find nothing (exit 3)."""
    jobs = {queue.drop(f"race-{i}") for i in range(5)}
    argv = [*CTX_ARGV, "queue", "claim", "--project", queue.project]
    env = clean_env(CTX_STORAGE=str(queue.storage))
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    results = [(p.communicate(timeout=60), p.returncode) for p in procs]
    won = [out.strip() for (out, _err), rc in results if rc == 0]
    assert sorted(rc for _, rc in results) == [0] * 5 + [3] * 3, results
    assert sorted(won) == sorted(jobs)
    queue_holds(queue, claimed=jobs, lease=jobs)


def test_a_leftover_claim_directory_blocks_the_claim_until_reconciled(queue: QueueCLI) -> None:
    """Q-2: "mkdir claimed/J is the single exclusive arbitration point (EEXIST = lost)";
    Q-6: "an empty claimed/J ... with no request anywhere in claimed → removed" by
    ``recover --reconcile``, while plain recover "reports it and changes nothing" (exit 1)."""
    job = queue.drop("blocked")
    (queue.dir / "claimed" / job).mkdir()
    claimed = queue.run("claim")
    assert claimed.rc == 3 and claimed.out == "", claimed
    before = snapshot(queue.dir)
    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    queue_holds(queue, pending={job})
    assert queue.claim() == job


def test_entries_that_are_not_jobs_are_ignored(queue: QueueCLI, scratch: Path) -> None:
    """Q-8: "illegal names, dot-files, symlinks, and non-regular request ... files are not
    queue jobs.  They are never followed, opened through a link, executed or moved; ctx
    queue status lists them as ignored with the reason."  Claim finds nothing (exit 3);
    recover moves nothing; a symlinked claim directory is not followed."""
    outside = scratch / "outside"
    outside.mkdir()
    (outside / "linked.req.json").write_text(json.dumps(request()))
    (outside / "claimdir.req.json").write_text(json.dumps(request()))
    pending = queue.dir / "pending"
    (pending / ".dot.req.json").write_text(json.dumps(request()))
    (pending / "bad name.req.json").write_text(json.dumps(request()))
    (pending / "linked.req.json").symlink_to(outside / "linked.req.json")
    (pending / "dir.req.json").mkdir()
    os.mkfifo(pending / "fifo.req.json")
    (queue.dir / "claimed" / "claimdir.req.json").symlink_to(outside)
    before, outside_before = snapshot(queue.dir), snapshot(outside)
    claimed = queue.run("claim")
    assert claimed.rc == 3 and claimed.out == "", claimed
    for args in ((), ("--reconcile",)):
        assert queue.run("recover", *args).rc in (0, 1)
    assert snapshot(queue.dir) == before
    assert snapshot(outside) == outside_before
    status = queue.run("status")
    assert status.rc == 0, status
    assert "ignored" in status.out
    names = [
        ".dot.req.json",
        "bad name.req.json",
        "linked.req.json",
        "dir.req.json",
        "fifo.req.json",
    ]
    for name in [*names, "claimdir.req.json"]:
        assert name in status.out, name
    as_json = queue.run("status", "--json")
    assert as_json.rc == 0
    dumped = json.dumps(as_json.json())
    assert all(json.dumps(name)[1:-1] in dumped for name in names)


# ------------------------------------------------------------------------------ renew


def test_renew_extends_the_callers_own_lease(queue: QueueCLI) -> None:
    """§2.4: "ctx queue renew --project P J extends the caller's own lease"; Q-3: "A worker
    MAY renew its own lease (rewrite atomically)"; --ttl S sets the new lifetime."""
    job = queue.drop("renewed")
    queue.claim("--ttl", "30")
    first = queue.lease(job)
    renewed = queue.run("renew", job, "--ttl", "600")
    assert renewed.rc == 0, renewed
    lease = queue.lease(job)
    assert epoch(lease["expires_at"]) > epoch(first["expires_at"]) + 500
    assert abs(epoch(lease["expires_at"]) - time.time() - 600) < 30
    assert int(lease["pid"]) == os.getpid()
    assert queue.state(job) == "claimed"
    queue_holds(queue, claimed={job}, lease={job})


def test_renew_refuses_a_lease_held_by_another_process(
    queue: QueueCLI, holder: subprocess.Popen
) -> None:
    """Q-3: "A worker MAY renew its own lease ...; no other process renews leases"; §2.4:
    exit 1 "operation refused".  The lease is left byte for byte."""
    job = queue.drop("held")
    queue.claim("--pid", str(holder.pid))
    before = snapshot(queue.dir)
    renewed = queue.run("renew", job, "--ttl", "600")
    assert renewed.rc == 1, renewed
    assert snapshot(queue.dir) == before


def test_renew_refuses_a_job_that_is_not_claimed(queue: QueueCLI) -> None:
    """§2.4 renew "extends the caller's own lease": a pending job has no lease to extend;
    exit 1 "operation refused", nothing changed."""
    job = queue.drop("waiting")
    before = snapshot(queue.dir)
    renewed = queue.run("renew", job)
    assert renewed.rc == 1, renewed
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------


def test_finish_ok_makes_the_done_pair_and_clears_claim_and_lease(
    queue: QueueCLI, scratch: Path
) -> None:
    """Q-4 with §2.1: done = "done/J and done/J.result"; "then remove lease/J/worker,
    lease/J, claimed/J"; the result is "one JSON object: {status: ok|error, output, worker,
    started, finished}"; done/J is the request that was claimed."""
    job = queue.drop("fin")
    request_bytes = (queue.dir / "pending" / job).read_bytes()
    queue.claim()
    result_file = scratch / "result.json"
    result_file.write_text(json.dumps({"marker": "finish-ok-7d1"}))
    finished = queue.run("finish", job, "--ok", result_file)
    assert finished.rc == 0, finished
    queue_holds(queue, done={job, f"{job}.result"})
    assert (queue.dir / "done" / job).read_bytes() == request_bytes
    text = (queue.dir / "done" / f"{job}.result").read_text("utf-8")
    result = json.loads(text)
    assert result["status"] == "ok"
    for key in ("output", "worker", "started", "finished"):
        assert key in result, key
    assert "finish-ok-7d1" in text


def test_finish_error_from_stdin_and_without_result_file(queue: QueueCLI) -> None:
    """Q-4: the result moves to failed/J.result and the request to failed/J; §2.4 "finish
    --project P J (--ok | --error) [RESULT_FILE | -]": the result comes from stdin with -, and
    RESULT_FILE may be left out; §2.1 status "error" / "ok"."""
    failing, bare = queue.drop("failing"), queue.drop("bare")
    assert queue.claim() == failing
    finished = queue.run(
        "finish", failing, "--error", "-", input=json.dumps({"marker": "fail-3c9"})
    )
    assert finished.rc == 0, finished
    text = (queue.dir / "failed" / f"{failing}.result").read_text("utf-8")
    assert json.loads(text)["status"] == "error"
    assert "fail-3c9" in text
    assert queue.claim() == bare
    finished = queue.run("finish", bare, "--ok")
    assert finished.rc == 0, finished
    state, result = queue.only_result(bare)
    assert state == "done" and result["status"] == "ok"
    queue_holds(queue, failed={failing, f"{failing}.result"}, done={bare, f"{bare}.result"})


def test_finish_refuses_a_job_that_is_not_claimed(queue: QueueCLI) -> None:
    """Q-4 finishes a claim; I-3: "After finish returned success, J is never executed
    again and never returns to pending".  Finishing a pending job, or a done job again, is
    refused (exit 1) and changes nothing."""
    queue.drop("finished")
    pending = queue.drop("waiting")
    assert queue.claim() == "finished.req.json"
    queue.finish("finished.req.json")
    before = snapshot(queue.dir)
    for job, flag in (
        (pending, "--ok"),
        ("finished.req.json", "--error"),
        ("finished.req.json", "--ok"),
    ):
        again = queue.run("finish", job, flag, "-", input="{}")
        assert again.rc == 1, again
        assert snapshot(queue.dir) == before


def test_finish_never_replaces_an_existing_result(queue: QueueCLI) -> None:
    """Q-4: the result is moved "without replacing" to done/J.result; Q-6: "nothing may
    overwrite ... result ... evidence".  A result already there stays; finish is refused."""
    job = queue.drop("answered")
    queue.claim()
    old = json.dumps({"status": "ok", "output": "first-result"})
    (queue.dir / "done" / f"{job}.result").write_text(old)
    before = snapshot(queue.dir)
    finished = queue.run("finish", job, "--ok", "-", input=json.dumps({"second": True}))
    assert finished.rc == 1, finished
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------ §2.4 usage


def test_usage_errors_exit_2_and_change_nothing(queue: QueueCLI) -> None:
    """§2.4: "Exit status ... 2 usage error": a missing argument (FILE, J, --project), a
    malformed option value, or not exactly one of "finish ... (--ok | --error)"; nothing in
    the queue changes (the claimed job stays claimed)."""
    job = queue.drop("bystander")
    assert queue.claim() == job
    before = snapshot(queue.dir)
    for args in (
        ("publish",),
        ("claim", "--ttl", "soon"),
        ("finish",),
        ("finish", job, "--ok", "--error"),
        ("finish", job),
        ("list", "--state", "nowhere"),
        ("recover", "--grace", "later"),
    ):
        done = queue.run(*args)
        assert done.rc == 2, done
    no_project = ctx_run("queue", "status", env=clean_env(CTX_STORAGE=str(queue.storage)))
    assert no_project.rc == 2, no_project
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------ status, list, show


def test_status_counts_and_list_filters_by_state(queue: QueueCLI, holder: subprocess.Popen) -> None:
    """§2.4: "status --project P [--json] # counts per state" (exit 0 on a consistent queue)
    and "list --project P [--state S]": each state shows its jobs and no other;
    without --state every job is listed."""
    claimed = queue.drop("c1")
    assert queue.claim("--pid", str(holder.pid)) == claimed
    expected = {
        "pending": {queue.drop("p1"), queue.drop("p2")},
        "claimed": {claimed},
        "done": {queue.terminal("d1", "done")},
        "failed": {queue.terminal("f1", "failed")},
    }
    every = set().union(*expected.values())
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    for state, jobs in expected.items():
        assert len(jobs) in find_values(status.json(), state), (state, status)
    everything = queue.run("list")
    assert everything.rc == 0, everything
    assert all(job in everything.out for job in every)
    for state, jobs in expected.items():
        listed = queue.run("list", "--state", state)
        assert listed.rc == 0, listed
        assert {job for job in every if job in listed.out} == jobs, (state, listed)


def test_show_names_every_piece_of_evidence(queue: QueueCLI) -> None:
    """§2.4: "show --project P J [--json] # every piece of evidence for J", the evidence of
    §2.1: claimed/J/J and lease/J/worker for a claimed job, done/J and done/J.result for a
    done one."""
    claimed = queue.drop("shown")
    queue.claim()
    for args in ((), ("--json",)):
        shown = queue.run("show", claimed, *args)
        assert shown.rc == 0, shown
        assert f"claimed/{claimed}/{claimed}" in shown.out, shown
        assert f"lease/{claimed}/worker" in shown.out, shown
    queue.finish(claimed)
    shown = queue.run("show", claimed, "--json")
    assert shown.rc == 0, shown
    parse_json_output(shown.out)
    assert re.search(rf"done/{re.escape(claimed)}(?!\.result)", shown.out), shown
    assert f"done/{claimed}.result" in shown.out, shown


def test_a_conflict_is_reported_with_exit_1_and_never_resolved(queue: QueueCLI) -> None:
    """Q-6: "J both pending and done ... is a conflict: reported with every piece of
    evidence, never resolved automatically"; §2.4: exit 1 "conflict found"; Q-6: recover
    exits 1 "when ... conflicts remain"."""
    job = queue.drop("twice")
    queue.terminal("twice", "done")
    before = snapshot(queue.dir)
    status = queue.run("status")
    assert status.rc == 1, status
    shown = queue.run("show", job)
    assert shown.rc == 1, shown
    for evidence in (f"pending/{job}", f"done/{job}", f"done/{job}.result"):
        assert evidence in shown.out, evidence
    for args in ((), ("--reconcile",)):
        recovered = queue.run("recover", *args)
        assert recovered.rc == 1, recovered
        assert job in recovered.out + recovered.err
    assert snapshot(queue.dir) == before


def test_json_output_of_every_command_is_machine_readable(queue: QueueCLI) -> None:
    """§2.4: "--json gives machine-readable output on stdout"."""
    published = queue.run("publish", "--json", "-", input=json.dumps(request()))
    assert published.rc == 0, published
    parse_json_output(published.out)
    job = queue.entries("pending").pop()
    claimed = queue.run("claim", "--json")
    assert claimed.rc == 0, claimed
    for args in (("status",), ("list",), ("show", job), ("recover",)):
        done = queue.run(*args, "--json")
        assert done.rc == 0, done
        assert done.out.strip(), done
        parse_json_output(done.out)
    finished = queue.run("finish", job, "--ok", "--json", "-", input="{}")
    assert finished.rc == 0, finished
    parse_json_output(finished.out)


# ------------------------------------------------------------------------------ I-5


def test_recover_requeues_a_claim_whose_holder_is_gone(queue: QueueCLI) -> None:
    """Q-5: "an unfinished claim goes back to pending/ only when both claim evidence and
    lease evidence exist, the lease holder is provably gone (same boot_id and same pid_ns,
    and the pid is dead ...)"; exit 0 once consistent; I-5: a second run changes nothing."""
    job = queue.drop("orphaned")
    original = (queue.dir / "pending" / job).read_bytes()
    assert claim_for_dead_holder(queue) == job
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    queue_holds(queue, pending={job})
    assert (queue.dir / "pending" / job).read_bytes() == original
    before = snapshot(queue.dir)
    again = queue.run("recover", "--reconcile")
    assert again.rc == 0, again
    assert snapshot(queue.dir) == before


def test_recover_never_touches_a_live_holders_claim(
    queue: QueueCLI, holder: subprocess.Popen
) -> None:
    """Q-6: "Neither recover nor recover --reconcile ever touches a job whose lease holder is
    alive"; a complete claim is a consistent state: exit 0."""
    job = queue.drop("alive")
    queue.claim("--pid", str(holder.pid))
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        recovered = queue.run("recover", *args)
        assert recovered.rc == 0, recovered
        assert snapshot(queue.dir) == before
    assert queue.state(job) == "claimed"


def test_recover_requeues_a_lease_taken_before_a_reboot(
    queue: QueueCLI, holder: subprocess.Popen
) -> None:
    """Q-5: the holder is provably gone on "the same host with another boot", whatever its
    pid now names (here a live process)."""
    job = queue.drop("rebooted")
    queue.claim("--pid", str(holder.pid), "--ttl", "100000")
    edit_lease(queue, job, boot_id=OTHER_BOOT)
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    queue_holds(queue, pending={job})


def test_a_pid_alone_is_never_proof_across_hosts_or_namespaces(queue: QueueCLI) -> None:
    """Q-5: "a pid alone is never proof across hosts or pid namespaces"; N-1: "Liveness
    across hosts uses the lease's host/boot_id/expires_at, never a pid alone".  Unexpired
    leases of another host and of another pid namespace, whose pids are dead here, stay."""
    other_host, other_ns = queue.drop("other-host"), queue.drop("other-ns")
    claimed = {claim_for_dead_holder(queue, "--ttl", "100000") for _ in range(2)}
    assert claimed == {other_host, other_ns}
    edit_lease(queue, other_host, host="elsewhere.invalid", boot_id=OTHER_BOOT, pid_ns=PID_NS + 7)
    edit_lease(queue, other_ns, pid_ns=PID_NS + 7)
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        recovered = queue.run("recover", *args)
        assert recovered.rc == 0, recovered
        assert snapshot(queue.dir) == before


def test_an_expired_lease_of_another_host_is_requeued(queue: QueueCLI) -> None:
    """Q-5: the holder is provably gone when "the lease expired"; N-1: liveness across hosts
    uses expires_at.  A lease of another host, taken for half a second, is requeued once
    past."""
    job = queue.drop("expired")
    claim_for_dead_holder(queue, "--ttl", "0.5")
    edit_lease(queue, job, host="elsewhere.invalid", boot_id=OTHER_BOOT, pid_ns=PID_NS + 7)
    expires = epoch(queue.lease(job)["expires_at"])
    wait_for(lambda: time.time() > expires + 0.2, seconds=30)
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    queue_holds(queue, pending={job})


def test_a_claim_without_lease_is_reported_then_requeued_by_reconcile(queue: QueueCLI) -> None:
    """Q-6: "claimed/J/J without lease/J/worker → back to pending (execution never
    started)" under --reconcile; "plain recover reports it and changes nothing" and exits 1
    ("when incomplete pairs (plain recover) ... remain"); I-5 converges."""
    job = queue.drop("unleased")
    original = (queue.dir / "pending" / job).read_bytes()
    put_in_claimed(queue, job)
    before = snapshot(queue.dir)
    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert job in plain.out + plain.err
    assert snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    queue_holds(queue, pending={job})
    assert (queue.dir / "pending" / job).read_bytes() == original
    settled = snapshot(queue.dir)
    assert queue.run("recover", "--reconcile").rc == 0
    assert snapshot(queue.dir) == settled


def test_a_result_beside_a_claim_rolls_forward(queue: QueueCLI) -> None:
    """Q-6: "done/J.result (or failed/J.result) with claimed/J/J → roll forward: finish the
    rename and clean the claim and lease"; plain recover does not requeue them (Q-5: "no ...
    terminal evidence for J"), changes nothing and exits 1."""
    jobs = {"done": queue.drop("ran-ok"), "failed": queue.drop("ran-badly")}
    requests, results = {}, {}
    for terminal, job in jobs.items():
        requests[terminal] = (queue.dir / "pending" / job).read_bytes()
        assert claim_for_dead_holder(queue) == job
        status = "ok" if terminal == "done" else "error"
        results[terminal] = json.dumps(
            {"status": status, "output": "kept", "worker": {}, "started": "x", "finished": "y"}
        )
        (queue.dir / terminal / f"{job}.result").write_text(results[terminal])
    before = snapshot(queue.dir)
    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    queue_holds(queue, **{t: {j, f"{j}.result"} for t, j in jobs.items()})
    for terminal, job in jobs.items():
        assert (queue.dir / terminal / job).read_bytes() == requests[terminal]
        assert (queue.dir / terminal / f"{job}.result").read_text() == results[terminal]


def test_orphan_claim_and_lease_directories_are_removed_by_reconcile(queue: QueueCLI) -> None:
    """Q-6: "an empty claimed/J or an orphan lease/J with no request anywhere in claimed →
    removed" by --reconcile; plain recover reports them, changes nothing, exits 1."""
    lease_only = queue.drop("lease-only")
    claim_for_dead_holder(queue)
    shutil.rmtree(queue.dir / "claimed" / lease_only)
    (queue.dir / "claimed" / "empty-claim.req.json").mkdir()
    kept = queue.terminal("unrelated", "done")
    before = snapshot(queue.dir)
    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    queue_holds(queue, done={kept, f"{kept}.result"})


def test_stray_temp_files_are_removed_only_past_the_grace_period(queue: QueueCLI) -> None:
    """Q-6: "stray temp files in inbox/ older than the grace period → removed" by
    --reconcile; §2.4 "--grace SECONDS".  Plain recover leaves them; a younger one stays."""
    old, young = queue.dir / "inbox" / "tmp-old", queue.dir / "inbox" / "tmp-young"
    old.write_text("partial")
    young.write_text("partial")
    age(old, 3600)
    plain = queue.run("recover")
    assert plain.rc in (0, 1), plain
    assert queue.entries("inbox") == {"tmp-old", "tmp-young"}
    fixed = queue.run("recover", "--reconcile", "--grace", "600")
    assert fixed.rc == 0, fixed
    assert queue.entries("inbox") == {"tmp-young"}


def test_dry_run_changes_nothing(queue: QueueCLI) -> None:
    """§2.4 "recover ... [--reconcile] [--dry-run]": a dry run reports and changes nothing,
    with or without --reconcile; the real run then repairs everything (exit 0)."""
    gone = queue.drop("gone")
    claim_for_dead_holder(queue)
    unleased = queue.drop("unleased")
    put_in_claimed(queue, unleased)
    stray = queue.dir / "inbox" / "tmp-stray"
    stray.write_text("x")
    age(stray, 3600)
    before = snapshot(queue.dir)
    for args in (("--dry-run",), ("--reconcile", "--dry-run"), ("--dry-run", "--json")):
        looked = queue.run("recover", *args)
        assert looked.rc in (0, 1), looked
        assert snapshot(queue.dir) == before, args
    fixed = queue.run("recover", "--reconcile", "--grace", "60")
    assert fixed.rc == 0, fixed
    queue_holds(queue, pending={gone, unleased})


def test_recover_never_overwrites_pending_evidence(queue: QueueCLI) -> None:
    """Q-5: requeue only when "there is no pending or terminal evidence for J"; "The move is
    no-replace"; Q-6 a J both claimed and pending is a conflict: exit 1, nothing changed."""
    job = queue.drop("dup")
    claim_for_dead_holder(queue)
    (queue.dir / "pending" / job).write_text(json.dumps(request(tag="another copy")))
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        recovered = queue.run("recover", *args)
        assert recovered.rc == 1, recovered
        assert snapshot(queue.dir) == before


def test_two_results_are_a_conflict(queue: QueueCLI) -> None:
    """Q-6: "Anything else (e.g. J both pending and done, two results) is a conflict ...
    never resolved automatically"; exit 1."""
    job = queue.drop("two-results")
    claim_for_dead_holder(queue)
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps({"status": "ok", "output": 1}))
    (queue.dir / "failed" / f"{job}.result").write_text(
        json.dumps({"status": "error", "output": 2})
    )
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        recovered = queue.run("recover", *args)
        assert recovered.rc == 1, recovered
        assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------ §3 workers


def test_worker_runs_jobs_as_its_agent_and_records_each_outcome(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """W-1: a worker "executes the request's tool with its input through the normal tool
    authorization chain ... under the worker's agent identity, and finishes with done/ on
    success or failed/ on tool failure (non-zero exit, timeout, authorization denied),
    recording the reason in the result"; P-6: a tool the agent is not allowed is EACCES;
    W-2: --drain "processes until the queue is empty and exits"; R-2: nothing new at the
    root."""
    make_agent(searchable_storage, "runner", ["shell.exec"], "--user", unprivileged_user.name)
    queue = QueueCLI(searchable_storage, "proj")
    ok = queue.drop("ok", shell_job("id -u"))
    bad = queue.drop("bad", shell_job("exit 37"))
    denied = queue.drop("denied", request("fs.write", input={"path": "x", "content": "y"}))
    worked = work(queue, "--drain", agent="runner")
    assert worked.rc == 0, worked
    state, result = queue.only_result(ok)
    assert state == "done" and result["status"] == "ok"
    assert str(unprivileged_user.uid) in json.dumps(result["output"])
    for key in ("worker", "started", "finished"):
        assert key in result, key
    state, result = queue.only_result(bad)
    assert state == "failed" and result["status"] == "error"
    assert "37" in json.dumps(result)
    state, result = queue.only_result(denied)
    assert state == "failed" and result["status"] == "error"
    assert "EACCES" in json.dumps(result)
    queue_holds(
        queue,
        done={ok, f"{ok}.result"},
        failed={bad, f"{bad}.result", denied, f"{denied}.result"},
    )
    assert set(os.listdir(searchable_storage)) == ROOT_ENTRIES


def test_drain_and_max_jobs(work_queue: QueueCLI) -> None:
    """W-2: "ctx queue work --drain processes until the queue is empty and exits" (on an
    empty queue: at once, exit 0, nothing changed); §2.4 "work --project P [--drain]
    [--max-jobs N]": with --max-jobs 1 the worker takes one job and exits, the others stay
    pending."""
    before = snapshot(work_queue.dir)
    worked = work(work_queue, "--drain")
    assert worked.rc == 0, worked
    assert snapshot(work_queue.dir) == before
    jobs = {work_queue.drop(f"m{i}", shell_job("true")) for i in range(3)}
    worked = work(work_queue, "--max-jobs", "1", "--drain")
    assert worked.rc == 0, worked
    finished = {j for j in jobs if work_queue.state(j) == "done"}
    assert len(finished) == 1
    assert work_queue.entries("pending") == jobs - finished
    assert work_queue.entries("claimed") == set() and work_queue.entries("lease") == set()


def test_sigterm_lets_the_running_job_finish_then_exits(work_queue: QueueCLI, outbox: Path) -> None:
    """W-4: "SIGTERM to a worker lets the running job finish or time out, then exits
    cleanly"; Q-3/I-4: while the job runs it is claimed (claimed/J/J and lease/J/worker,
    the lease naming this host and boot) and nowhere else.  The other job is not started."""
    started, release = outbox / "started", outbox / "release"
    cmd = (
        f"touch {started}; i=0; "
        f"while [ ! -e {release} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
    )
    job = work_queue.drop("a-long", shell_job(cmd))
    proc = start_worker(work_queue, "--max-jobs", "2")
    try:
        assert wait_for(started.exists, seconds=60), "the job never started"
        later = work_queue.drop("b-later", shell_job("true"))
        assert work_queue.state(job) == "claimed"
        lease = work_queue.lease(job)
        assert lease["host"] == socket.gethostname() and lease["boot_id"] == BOOT_ID
        proc.terminate()
        time.sleep(0.3)
        release.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    finally:
        stop(proc)
    assert work_queue.only_result(job)[0] == "done"
    queue_holds(work_queue, pending={later}, done={job, f"{job}.result"})


def test_a_job_over_its_timeout_is_killed_with_its_process_group(
    work_queue: QueueCLI, outbox: Path
) -> None:
    """W-4: "Per-job timeout; a job that exceeds it is killed (its process group) and
    finished as failed" (the timeout given with ``--timeout``); W-1 records the reason."""
    pidfile = outbox / "child.pid"
    job = work_queue.drop("slow", shell_job(f"sleep 4242 & echo $! > {pidfile}; wait"))
    worked = work(work_queue, "--drain", "--timeout", "1")
    assert worked.rc == 0, worked
    state, result = work_queue.only_result(job)
    assert state == "failed" and result["status"] == "error"
    assert "time" in json.dumps(result).lower()
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:
            process = psutil.Process(child)
            return process.status() == psutil.STATUS_ZOMBIE or "4242" not in process.cmdline()
        except psutil.NoSuchProcess:
            return True

    try:
        assert wait_for(gone, seconds=30), "the job's background process outlived the timeout"
    finally:
        if not gone():
            os.kill(child, 9)


def test_concurrency_runs_jobs_at_the_same_time(work_queue: QueueCLI, outbox: Path) -> None:
    """§2.4: "work ... [--concurrency N]": with N = 2, two jobs that each wait for the other
    to have started both succeed (run one after the other, the first would fail)."""

    def meet(me: str, other: str) -> dict:
        return shell_job(
            f"touch {outbox / me}; i=0; while [ ! -e {outbox / other} ]; do "
            f"i=$((i+1)); [ $i -gt 300 ] && exit 9; sleep 0.05; done"
        )

    a = work_queue.drop("meet-a", meet("a", "b"))
    b = work_queue.drop("meet-b", meet("b", "a"))
    worked = work(work_queue, "--drain", "--concurrency", "2")
    assert worked.rc == 0, worked
    assert work_queue.only_result(a)[0] == "done"
    assert work_queue.only_result(b)[0] == "done"


def test_two_workers_never_run_a_job_twice(work_queue: QueueCLI, outbox: Path) -> None:
    """W-3: "Several workers ... may run at once; none double-executes a job (I-4)": every
    job runs exactly once and ends done."""
    log = outbox / "runs"
    jobs = {work_queue.drop(f"j{i}", shell_job(f"echo j{i} >> {log}")) for i in range(8)}
    procs = [start_worker(work_queue, "--drain") for _ in range(2)]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, (out, err)
    finally:
        for proc in procs:
            stop(proc)
    assert sorted(log.read_text().split()) == sorted(f"j{i}" for i in range(8))
    for job in jobs:
        assert work_queue.only_result(job)[0] == "done"
    queue_holds(work_queue, done=jobs | {f"{j}.result" for j in jobs})
