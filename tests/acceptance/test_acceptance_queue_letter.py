"""SPEC §0, §1, §2 and §14 to the letter: the claims of the storage root (R-1..R-5), the queue
(§2.1-§2.4) and N-1 that the other acceptance files leave unchecked — every queue command's
--json, usage errors and exit statuses, queue paths, the storage precedence, status / list /
show in every state, recover's transitions and its dry run, name boundaries, what bootstrap
puts in place and where the default root is."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    REPO,
    ROOT_ENTRIES,
    SUFFIX,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    find_values,
    is_object_name,
    request,
    rfc3339,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root
from tests.support.strace import trace_lines
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

DAY = 86400
PAST = "2000-01-01T00:00:00Z"
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
MANUAL_PAGES = (
    "ctx.agent.md",
    "ctx.tool.md",
    "ctx.model.md",
    "ctx.coreutils.md",
    "ctx.root-abi.md",
    "ctx.session.md",
    "ctx.provider.md",
)


# --- helpers ------------------------------------------------------------------------------------


def deep_snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` and ``top`` itself: kind, mode, owner, mtime and content."""
    tree: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in [".", *dirnames, *filenames]:
            p = Path(dirpath) if name == "." else Path(dirpath, name)
            rel = str(p.relative_to(top))
            st = p.lstat()
            meta = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_mtime_ns)
            if stat.S_ISLNK(st.st_mode):
                tree[rel] = (*meta, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                tree[rel] = (*meta, p.read_bytes())
            else:
                tree[rel] = meta
    return tree


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def long_ago(queue: QueueCLI) -> None:
    """Every entry of the state directories a day old (a crash long past, see the recover
    acceptance file: Q-6 names leftovers without an age; a day-old one is one under every
    reading)."""
    for sub in ("pending", "claimed", "lease", "done", "failed", "inbox"):
        for path in (queue.dir / sub).rglob("*"):
            age(path, DAY)


def json_docs(out: str) -> list:
    """stdout as one JSON document, or as JSON Lines; fails when it is neither."""
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def _spec_lease(**fields) -> dict:
    """A lease with exactly the fields Q-3 names (no start time: the pid is judged alone)."""
    lease = {
        "worker": "hand-written",
        "host": socket.gethostname(),
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": os.getpid(),
        "claimed_at": "2026-01-01T00:00:00Z",
        "expires_at": "2099-01-01T00:00:00Z",
    }
    lease.update(fields)
    return lease


def claimed_by_dead_holder(queue: QueueCLI, name: str) -> str:
    job = queue.drop(name)
    r = queue.run("claim", "--pid", str(dead_pid()))
    assert (r.rc, r.out) == (0, job + "\n"), r
    return job


def claim_without_lease(queue: QueueCLI, name: str) -> str:
    job = name + SUFFIX
    (queue.dir / "claimed" / job).mkdir()
    (queue.dir / "claimed" / job / job).write_text(json.dumps(request(tag=name)))
    return job


def orphan_lease(queue: QueueCLI, name: str) -> str:
    """``lease/J/worker`` of a dead holder on this host, with no request anywhere."""
    donor = claimed_by_dead_holder(queue, name + "-donor")
    lease = queue.lease(donor)
    job = name + SUFFIX
    (queue.dir / "lease" / job).mkdir()
    queue.write_lease(job, lease)
    return job


# --- §0 -----------------------------------------------------------------------------------------


def test_s0_top_level_layout_and_python_version():
    """§0: Python >= 3.11; top level pyproject.toml, cortexfs/, cortexfs/shared/,
    cortexfs/queue/, cortexfs/fuse/, workers/, tests/crash/, tests/, docs/; the design card's
    packages and no ``watchdog``."""
    for entry in ("pyproject.toml",):
        assert (REPO / entry).is_file(), entry
    for entry in ("cortexfs", "cortexfs/shared", "cortexfs/queue", "cortexfs/fuse", "workers"):
        assert (REPO / entry).is_dir(), entry
    for entry in ("tests/crash", "tests", "docs"):
        assert (REPO / entry).is_dir(), entry
    project = (REPO / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in project
    for package in ("pyfuse3", "filelock", "psutil", "hypothesis", "click"):
        assert package in project, package
    assert "watchdog" not in project


def test_s0_no_queue_command_leaves_a_process_behind(queue, tmp_path):
    """§0, §2, Q-5: the queue is "not a daemon", recover has "no background watcher, no
    polling service": once a command has exited, nothing it started runs on."""
    src = tmp_path / "r.json"
    src.write_text(json.dumps(request()))
    for args in (
        ["publish", src],
        ["claim"],
        ["status"],
        ["recover"],
        ["recover", "--reconcile"],
        ["work", "--drain"],
    ):
        argv = [*CTX_ARGV, "queue", args[0], "--project", "proj", *map(str, args[1:])]
        proc = subprocess.Popen(
            argv,
            env=clean_env(CTX_STORAGE=str(queue.storage)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        proc.wait(timeout=60)
        time.sleep(0.1)
        left = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getsid(int(entry.name)) == proc.pid:
                        left.append(entry.name)
                except (ProcessLookupError, PermissionError):
                    pass
        assert left == [], (args, left)


# --- where the storage root is --------------------------------------------------------------


def _in_private_var_lib(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``script`` in a mount namespace of its own where /var/lib/cortexfs (or /var/lib when
    it is missing) is an empty tmpfs: the system default root can be made and looked at
    without touching the machine's."""
    target = "/var/lib/cortexfs" if Path("/var/lib/cortexfs").is_dir() else "/var/lib"
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs none {target} && {script}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def private_mounts():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to hide the system storage root")
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr!r}")


@pytest.mark.parametrize("xdg", [False, True], ids=["plain", "with-XDG_DATA_HOME"])
def test_r1_roots_default_root_is_var_lib_cortexfs_storage_current(private_mounts, tmp_path, xdg):
    """R-1: "The system default is /var/lib/cortexfs/storage/current"; the $XDG_DATA_HOME
    default is the [decision] for a non-root user, so root's default stays the system one."""
    env = clean_env()
    if xdg:
        env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    ctx = CTX_ARGV[0]
    done = _in_private_var_lib(
        f"{ctx} bootstrap >/dev/null && {ctx} queue init --project p >/dev/null"
        " && ls -A /var/lib/cortexfs/storage/current"
        " && ls -A /var/lib/cortexfs/storage/current/shared/p/queue",
        env,
    )
    assert done.returncode == 0, done
    listed = done.stdout.split()
    assert set(listed) >= ROOT_ENTRIES, done
    assert set(listed) >= QUEUE_SUBDIRS, done
    assert not (tmp_path / "xdg").exists()


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A directory any uid can reach (pytest's own temp dirs are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="ctx-letter-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_r1_ctx_storage_and_storage_override_a_normal_users_default(
    unprivileged_user, reachable_dir
):
    """R-1: "CTX_STORAGE or --storage DIR overrides it everywhere" — for a non-root user too:
    CTX_STORAGE beats $XDG_DATA_HOME, and --storage beats both."""
    user = unprivileged_user
    home = reachable_dir / "home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "xdg"),
    }
    ctx = CTX_ARGV[0]
    from_env = home / "env-root"
    done = run_as(
        user, [ctx, "queue", "init", "--project", "p"], env={**env, "CTX_STORAGE": str(from_env)}
    )
    assert done.returncode == 0, done
    assert (from_env / "shared/p/queue/pending").is_dir()
    assert not (home / "xdg").exists()

    from_opt = home / "opt-root"
    done = run_as(
        user,
        [ctx, "queue", "init", "--storage", str(from_opt), "--project", "q"],
        env={**env, "CTX_STORAGE": str(from_env)},
    )
    assert done.returncode == 0, done
    assert (from_opt / "shared/q/queue/pending").is_dir()
    assert not (from_env / "shared/q").exists()
    assert not (home / "xdg").exists()


@pytest.mark.parametrize(
    "command",
    ["publish", "claim", "renew", "finish", "status", "list", "show", "recover", "work"],
)
def test_r1_storage_option_beats_ctx_storage_for_every_queue_command(_template, tmp_path, command):
    """R-1, §2.4: --storage and CTX_STORAGE both override the default "everywhere"; given both,
    every queue command acts on --storage's root and leaves CTX_STORAGE's alone."""
    chosen, other = tmp_path / "chosen", tmp_path / "other"
    copy_of_root(_template, chosen)
    copy_of_root(_template, other)
    mine = QueueCLI(chosen, "proj")
    env = clean_env(CTX_STORAGE=str(other))
    job = None
    if command in ("renew", "finish", "show"):
        job = mine.drop("target")
        if command != "show":
            assert mine.claim() == job
    elif command in ("claim", "work", "list"):
        job = mine.drop("target")
    before_other = deep_snapshot(other)
    args: list = ["queue", command, "--storage", chosen, "--project", "proj"]
    stdin = ""
    if command == "publish":
        args += ["--name", "target", "-"]
        stdin = json.dumps(request())
    elif command == "renew":
        args += [job, "--ttl", "999"]
    elif command == "finish":
        args += [job, "--ok"]
    elif command == "show":
        args += [job]
    elif command == "work":
        args += ["--drain"]
    r = ctx_run(*args, input=stdin, env=env)
    assert r.rc == 0, r
    assert deep_snapshot(other) == before_other
    job = job or "target" + SUFFIX
    expected = {
        "publish": "pending",
        "claim": "claimed",
        "renew": "claimed",
        "finish": "done",
        "show": "pending",
        "list": "pending",
        "status": None,
        "recover": None,
        "work": "failed",  # no agent: every job claimed is refused (W-1), finished in failed/
    }[command]
    if expected:
        assert mine.state(job) == expected, r
    if command in ("show", "list"):
        assert job in r.out
    # R-2, §0: nothing at the root besides the six entries (no audit/, no queue/) after any
    # command, a worker's run included
    assert set(os.listdir(chosen)) == ROOT_ENTRIES


# --- what bootstrap puts in place ---------------------------------------------------


def test_r5_bootstrap_installs_the_core_tools_tsh_config_and_the_manual_bundle(storage):
    """R-5: "the root ABI directories, the core tools (fs.read, fs.list, fs.stat, fs.write,
    shell.exec, tsh.config, …), tool/tsh.d/config, and the docs bundle shared/cortexfs-docs/";
    T-1: each tool is an executable tool/<name> plus its tool/<name>.d/; D-1: the bundle's
    README.md and man pages."""
    assert set(os.listdir(storage)) == ROOT_ENTRIES
    for name in CORE_TOOLS:
        endpoint = storage / "tool" / name
        assert endpoint.is_file() and os.access(endpoint, os.X_OK), name
        assert (storage / "tool" / f"{name}.d").is_dir(), name
    config = (storage / "tool" / "tsh.d" / "config").read_text()
    keys = {
        line.split("=", 1)[0].strip()
        for line in config.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    assert {"max_loaded_tools", "cache_capacity", "window_percent"} <= keys, config
    docs = storage / "shared" / "cortexfs-docs"
    assert (docs / "README.md").is_file()
    for page in MANUAL_PAGES:
        assert (docs / "man" / page).is_file(), page
    # "/ctx/mcp/github and /ctx/mcp/figma MUST NOT exist"
    assert not (storage / "mcp").exists()


def test_r2_queue_init_on_a_missing_root_creates_only_root_abi_entries(tmp_path):
    """R-2: "Nothing else may be created at the root", whichever command makes the root."""
    root = tmp_path / "new-root"
    r = ctx_run("queue", "init", "--storage", root, "--project", "p")
    assert r.rc == 0, r
    assert set(os.listdir(root)) <= ROOT_ENTRIES
    assert set(os.listdir(root / "shared" / "p" / "queue")) - {"config"} == QUEUE_SUBDIRS


# --- object names at each boundary ----------------------------------------------------------

LEGAL_PROJECTS = [
    "a",
    "Z",
    "7",
    "x" * 64,
    "a.b",
    "a-b",
    "a_b",
    "a.",
    "a..b",
    "9-_.x",
    "x.D",
    "a.dd",
]
ILLEGAL_PROJECTS = [
    "x" * 65,
    ".a",
    "-a",
    "_a",
    ".",
    "..",
    "a.d",
    "a b",
    "a+b",
    "a:b",
    "a*",
    "a\tb",
    "é",
    "aé",
    "a\\b",
    "a~",
]


@pytest.mark.parametrize("name", LEGAL_PROJECTS)
def test_r3_legal_space_names_make_a_queue(storage, name):
    """R-3: 1 to 64 bytes of [A-Za-z0-9._-], first byte alphanumeric, not ending in ``.d``."""
    r = ctx_run("queue", "init", "--storage", storage, "--project", name)
    assert r.rc == 0, r
    assert (storage / "shared" / name / "queue" / "pending").is_dir()


@pytest.mark.parametrize("name", ILLEGAL_PROJECTS, ids=repr)
def test_r3_illegal_space_names_are_einval_and_make_nothing(storage, name):
    """R-3: "Anything else is rejected with EINVAL".

    # reading: refused (exit 1) or a usage error (exit 2); either way EINVAL on stderr.
    """
    before = deep_snapshot(storage)
    r = ctx_run("queue", "init", "--storage", storage, "--project", name)
    assert r.rc in (1, 2), r
    assert "EINVAL" in r.err
    assert deep_snapshot(storage) == before


def test_r3_an_empty_space_name_is_refused(storage):
    """R-3: at least 1 byte."""
    before = deep_snapshot(storage)
    r = ctx_run("queue", "init", "--storage", storage, "--project", "")
    assert r.rc in (1, 2), r
    assert "EINVAL" in r.err
    assert deep_snapshot(storage) == before


@pytest.mark.parametrize(
    ("given", "job"),
    [
        ("a", "a.req.json"),
        ("7", "7.req.json"),
        ("A_b-c.1", "A_b-c.1.req.json"),
        ("job.d", "job.d.req.json"),  # ends in .req.json, not .d
        ("x" * 55 + SUFFIX, "x" * 55 + SUFFIX),
    ],
)
def test_r3_legal_job_names_are_published(queue, given, job):
    """R-3, §2.1, §2.4: J is an object name ending in ``.req.json``."""
    r = queue.run("publish", "--name", given, "-", input=json.dumps(request()))
    assert (r.rc, r.out) == (0, job + "\n"), r
    assert queue.state(job) == "pending"


@pytest.mark.parametrize(
    "given",
    ["-a", "_a", "a b", "é", "a:b", "a\\b", "x" * 56 + SUFFIX, SUFFIX, "..", "a/../b"],
    ids=repr,
)
def test_r3_illegal_job_names_are_einval(queue, given):
    """R-3: anything else is EINVAL, nothing published, nothing staged."""
    before = deep_snapshot(queue.dir)
    r = queue.run("publish", "--name", given, "-", input=json.dumps(request()))
    assert r.rc in (1, 2), r
    assert "EINVAL" in r.err
    assert deep_snapshot(queue.dir) == before


@pytest.mark.parametrize("command", ["show", "renew", "finish"])
@pytest.mark.parametrize("job", ["../../../etc/passwd", ".hidden.req.json", "a b.req.json"])
def test_r3_an_illegal_job_argument_is_einval_and_touches_nothing(queue, command, job):
    """R-3, Q-8: a J on the command line is an object name too; ``..`` and ``/`` never reach
    outside the queue."""
    queue.drop("real")
    before = deep_snapshot(queue.storage)
    extra = ["--ok"] if command == "finish" else []
    r = queue.run(command, job, *extra)
    assert r.rc in (1, 2), r
    assert "EINVAL" in r.err
    assert deep_snapshot(queue.storage) == before


# --- §2.1: requests -----------------------------------------------------------------------------


def test_s21_a_request_without_from_and_created_gets_them(queue):
    """§2.1 [decision]: a request's fields are tool, input, from and created (RFC 3339), plus
    the publisher's extra fields.

    # reading: the publisher may leave out from and created; publish then records them.
    """
    job = queue.publish({"tool": "fs.stat", "input": {"path": "/"}, "extra": [1]}, name="bare")
    stored = json.loads((queue.dir / "pending" / job).read_text())
    assert stored["tool"] == "fs.stat" and stored["input"] == {"path": "/"}
    assert stored["extra"] == [1]
    assert isinstance(stored["from"], str) and stored["from"]
    rfc3339(stored["created"].replace("Z", "+00:00"))


def test_s21_requests_are_utf8(queue):
    """§2.1: "A request file is a regular file holding one JSON object (UTF-8)": UTF-8 text is
    kept; bytes that are not UTF-8 are refused."""
    good = request(note="café ✓ 日本")
    job = queue.publish(good, name="utf8")
    assert json.loads((queue.dir / "pending" / job).read_bytes().decode("utf-8")) == good

    bad = b'{"tool": "fs.read", "input": {"note": "caf\xe9"}}'
    r = queue.run("publish", "--name", "latin1", "-", input=bad)
    assert r.rc == 1, r
    assert queue.state("latin1" + SUFFIX) is None
    assert queue.entries("inbox") == set()


def test_s21_the_request_size_limit_is_configurable_in_queue_config(queue):
    """§2.1: "size limit 1 MiB (configurable per queue in queue/config, a key=value data
    file)".

    # reading: the key is the one ``queue init`` wrote with the value 1 MiB.
    """
    config = queue.dir / "config"
    lines = config.read_text().splitlines()
    keys = [
        line.split("=", 1)[0].strip()
        for line in lines
        if "=" in line
        and not line.lstrip().startswith("#")
        and line.split("=", 1)[1].strip() == str(1 << 20)
    ]
    assert len(keys) == 1, lines
    config.write_text(
        "\n".join(f"{keys[0]}=2048" if line.startswith(keys[0]) else line for line in lines) + "\n"
    )
    small = request(pad="x" * 1000)
    assert queue.publish(small, name="small") == "small" + SUFFIX
    r = queue.run("publish", "--name", "big", "-", input=json.dumps(request(pad="x" * 4096)))
    assert r.rc == 1, r
    assert r.err.strip()
    assert queue.state("big" + SUFFIX) is None


# --- §2.4: --json on every command ---------------------------------------------------------------


def test_s24_every_command_with_json_prints_json_on_stdout(storage, tmp_path):
    """§2.4: "--json gives machine-readable output on stdout", for each command of the block."""
    q = QueueCLI(storage, "jsonall")
    src = tmp_path / "r.json"
    src.write_text(json.dumps(request()))
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps(request(n=1)) + "\n" + json.dumps(request(n=2)) + "\n")
    result_file = tmp_path / "result.json"
    result_file.write_text(json.dumps({"answer": 1}))

    def run(*args, **kw):
        r = q.run(*args, "--json", **kw)
        assert r.rc == 0, r
        docs = json_docs(r.out)
        assert docs, r
        return docs

    run("init")
    run("publish", "--name", "one", src)
    run("publish", "--batch", batch)
    (claimed,) = run("claim")
    job = claimed["name"]
    run("renew", job, "--ttl", "600")
    run("show", job)
    run("finish", job, "--ok", result_file)
    run("status")
    run("list")
    for state in ("pending", "claimed", "done", "failed"):
        run("list", "--state", state)
    run("recover")
    run("recover", "--reconcile", "--dry-run")
    run("recover", "--reconcile", "--grace", "5")
    run("work", "--drain")
    assert json.loads((q.dir / "done" / f"{job}.result").read_text())["output"] == {"answer": 1}
    # §2: the queue has "exactly these subdirectories", after a whole life of jobs too
    subdirs = {e for e in os.listdir(q.dir) if (q.dir / e).is_dir()}
    assert subdirs == QUEUE_SUBDIRS


# --- §2.4: usage errors are exit 2 ---------------------------------------------------------------

USAGE_ERRORS = {
    # unknown options, per command
    "init-unknown": ["init", "--bogus"],
    "publish-unknown": ["publish", "--bogus", "-"],
    "claim-unknown": ["claim", "--bogus"],
    "renew-unknown": ["renew", "J", "--bogus"],
    "finish-unknown": ["finish", "J", "--ok", "--bogus"],
    "status-unknown": ["status", "--bogus"],
    "list-unknown": ["list", "--bogus"],
    "show-unknown": ["show", "J", "--bogus"],
    "recover-unknown": ["recover", "--bogus"],
    "work-unknown": ["work", "--bogus"],
    # missing arguments
    "renew-no-job": ["renew"],
    "finish-no-job": ["finish", "--ok"],
    "show-no-job": ["show"],
    "publish-batch-no-source": ["publish", "--batch"],
    "project-without-value": ["status", "--project"],
    "storage-without-value": ["status", "--storage"],
    # stray arguments
    "status-extra": ["status", "extra"],
    "claim-extra": ["claim", "extra"],
    "list-extra": ["list", "extra"],
    "recover-extra": ["recover", "extra"],
    "init-extra": ["init", "extra"],
    # bad values
    "claim-ttl-word": ["claim", "--ttl", "soon"],
    "claim-ttl-negative": ["claim", "--ttl", "-5"],
    "claim-ttl-empty": ["claim", "--ttl", ""],
    "renew-ttl-word": ["renew", "J", "--ttl", "later"],
    "renew-ttl-negative": ["renew", "J", "--ttl", "-1"],
    "claim-pid-word": ["claim", "--pid", "me"],
    "claim-pid-negative": ["claim", "--pid", "-3"],
    "recover-grace-word": ["recover", "--grace", "abc"],
    "recover-grace-negative": ["recover", "--grace", "-1"],
    "reconcile-grace-word": ["recover", "--reconcile", "--grace", "x"],
    "work-max-jobs-zero": ["work", "--drain", "--max-jobs", "0"],
    "work-max-jobs-negative": ["work", "--drain", "--max-jobs", "-2"],
    "work-max-jobs-word": ["work", "--drain", "--max-jobs", "many"],
    "work-concurrency-zero": ["work", "--drain", "--concurrency", "0"],
    "work-concurrency-word": ["work", "--drain", "--concurrency", "lots"],
    "list-bad-state": ["list", "--state", "bogus"],
    "list-state-missing-value": ["list", "--state"],
    # (--ok | --error)
    "finish-both": ["finish", "J", "--ok", "--error"],
    "finish-neither": ["finish", "J"],
    "finish-two-results": ["finish", "J", "--ok", "a.json", "b.json"],
    "publish-two-sources": ["publish", "-", "-"],
    "publish-batch-and-name": ["publish", "--batch", "--name", "x", "-"],
}


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_s24_every_usage_error_exits_2_and_changes_nothing(queue, case):
    """§2.4: "2 usage error" for each command's malformed command line, with and without
    --json; nothing changes."""
    job = claim_without_lease(queue, "J")
    (queue.dir / "lease" / job).mkdir()
    queue.write_lease(job, _spec_lease())
    queue.drop("waiting")
    args = [job if a == "J" else a for a in USAGE_ERRORS[case]]
    command, rest = args[0], args[1:]
    before = deep_snapshot(queue.storage)
    for json_flag in (False, True):
        flags = ["--json"] if json_flag else []
        r = queue.run(command, *flags, *rest, input=json.dumps(request()))
        assert r.rc == 2, r
        assert deep_snapshot(queue.storage) == before
        assert r.err.strip(), r
        if json_flag and r.out.strip():
            json_docs(r.out)  # "--json gives machine-readable output on stdout"


@pytest.mark.parametrize(
    "command",
    ["init", "publish", "claim", "renew", "finish", "status", "list", "show", "recover", "work"],
)
def test_s24_every_command_without_a_project_is_a_usage_error(storage, command):
    """§2.4: every command takes --project NAME (or a queue path); with neither it cannot know
    its queue: exit 2, nothing changes."""
    before = deep_snapshot(storage)
    extra = {"renew": ["J"], "finish": ["J", "--ok"], "show": ["J"], "publish": ["-"]}
    r = ctx_run(
        "queue",
        command,
        *extra.get(command, []),
        input=json.dumps(request()),
        env=clean_env(CTX_STORAGE=str(storage)),
    )
    assert r.rc == 2, r
    assert deep_snapshot(storage) == before


# --- §2.4: exit 3 means "nothing to claim", and only that ---------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["list"],
        ["list", "--state", "pending"],
        ["list", "--state", "claimed"],
        ["recover"],
        ["recover", "--reconcile"],
        ["recover", "--dry-run"],
        ["work", "--drain"],
    ],
    ids=" ".join,
)
def test_s24_only_claim_exits_3_on_an_empty_queue(queue, args):
    """§2.4: "3 nothing to claim" belongs to claim: the other commands on an empty queue
    succeed (exit 0)."""
    r = queue.run(*args)
    assert r.rc == 0, r


def test_s24_claim_exits_3_when_every_job_is_taken_or_finished(queue):
    """§2.4: a queue whose jobs are all claimed or finished has nothing to claim: exit 3,
    nothing printed, nothing changed."""
    queue.drop("taken")
    queue.claim()
    queue.terminal("finished", "done")
    queue.terminal("broken", "failed")
    before = deep_snapshot(queue.dir)
    for extra in ([], ["--json"]):
        r = queue.run("claim", *extra)
        assert r.rc == 3, r
        if not extra:
            assert r.out == "", r
    assert deep_snapshot(queue.dir) == before


def test_s24_losing_a_claim_for_an_unreadable_queue_is_not_exit_3(tmp_path):
    """§2.4: exit 3 says the queue is empty, so a claim on a queue that does not exist is an
    error (exit 1 or 2), never "nothing to claim"."""
    root = tmp_path / "root"
    assert ctx_run("bootstrap", "--storage", root).rc == 0
    r = ctx_run("queue", "claim", "--storage", root, "--project", "nosuch")
    assert r.rc in (1, 2), r


# --- §2.4: a queue path instead of --project -----------------------------------------------------


@pytest.mark.parametrize("where", ["inside-root", "outside-root"])
def test_s24_a_queue_path_addresses_the_queue_for_every_command(storage, tmp_path, where):
    """§2.4: "All commands take ... --project NAME (or a queue path)": the whole life of a job
    through the path of its queue directory."""
    if where == "inside-root":
        qdir = storage / "shared" / "proj" / "queue"
    else:
        qdir = tmp_path / "elsewhere" / "queue"
    env = clean_env(CTX_STORAGE=str(storage))

    def q(*args, **kw):
        return ctx_run("queue", args[0], "--project", qdir, *args[1:], env=env, **kw)

    r = q("init")
    assert r.rc == 0, r
    assert set(os.listdir(qdir)) >= QUEUE_SUBDIRS
    r = q("publish", "--name", "viapath", "-", input=json.dumps(request()))
    assert (r.rc, r.out) == (0, "viapath.req.json\n"), r
    job = "viapath.req.json"
    assert (qdir / "pending" / job).is_file()
    assert q("list", "--state", "pending").out.split() == [job]
    r = q("claim")
    assert (r.rc, r.out) == (0, job + "\n"), r
    assert (qdir / "lease" / job / "worker").is_file()
    assert q("renew", job, "--ttl", "500").rc == 0
    assert job in q("show", job).out
    r = q("finish", job, "--error", "-", input='{"why": "test"}')
    assert r.rc == 0, r
    assert (qdir / "failed" / job).is_file() and (qdir / "failed" / f"{job}.result").is_file()
    status = q("status", "--json")
    assert status.rc == 0, status
    assert 1 in [v if isinstance(v, int) else len(v) for v in find_values(status.json(), "failed")]
    assert q("recover").rc == 0
    assert q("work", "--drain").rc == 0
    if where == "outside-root":
        # the same job is not in the storage root's queue of any project
        assert not (storage / "shared" / "queue").exists()
        assert set(os.listdir(storage)) == ROOT_ENTRIES
    else:
        byname = QueueCLI(storage, "proj")
        assert byname.state(job) == "failed"


# --- §2.4 status, list, show ---------------------------------------------------------------------


@pytest.fixture
def every_kind(queue):
    """One job per state, plus an incomplete pair, a conflict and an ignored entry."""
    claimed = queue.drop("c1")
    assert queue.claim() == claimed
    kinds = {
        "pending": queue.drop("p1"),
        "claimed": claimed,
        "done": queue.terminal("d1", "done"),
        "failed": queue.terminal("f1", "failed"),
    }
    kinds["incomplete"] = claim_without_lease(queue, "half")
    conflict = queue.drop("both")
    queue.terminal("both", "done")
    kinds["conflict"] = conflict
    (queue.dir / "pending" / ".dotfile.req.json").write_text(json.dumps(request()))
    kinds["ignored"] = ".dotfile.req.json"
    long_ago(queue)
    return kinds


def test_s24_status_reports_counts_ignored_incomplete_and_conflicts_in_text(queue, every_kind):
    """§2.4: status: "counts per state, ignored entries, incomplete pairs"; Q-8: ignored with
    the reason; Q-6: a conflict reported with its evidence; exit 1 "conflict found".

    # reading: in text each of the four states has a line with its name and count; the
    # ignored entry, the incomplete job and the conflicting job are each named.
    """
    r = queue.run("status")
    assert r.rc == 1, r
    rows = [line.split() for line in r.lines()]
    for state in ("pending", "claimed", "done", "failed"):
        assert any(state in row and "1" in row for row in rows), (state, r)
    ignored_lines = [line for line in r.lines() if every_kind["ignored"] in line]
    assert ignored_lines and any(len(line.split()) > 1 for line in ignored_lines), r
    assert "ignored" in r.out
    assert every_kind["incomplete"] in r.out
    assert every_kind["conflict"] in r.out


def test_s24_status_json_reports_the_same(queue, every_kind):
    """§2.4 status --json: counts per state, the ignored entry, the incomplete pair and the
    conflict, machine-readably; exit 1 for the conflict."""
    r = queue.run("status", "--json")
    assert r.rc == 1, r
    doc = r.json()
    for state in ("pending", "claimed", "done", "failed"):
        counts = [v if isinstance(v, int) else len(v) for v in find_values(doc, state)]
        assert 1 in counts, (state, doc)
    assert every_kind["ignored"] in json.dumps(find_values(doc, "ignored")), doc
    assert every_kind["incomplete"] in json.dumps(find_values(doc, "incomplete")), doc
    conflicts = find_values(doc, "conflicts") + find_values(doc, "conflict")
    assert every_kind["conflict"] in json.dumps(conflicts), doc


def test_s24_list_state_for_every_state_in_text_and_json(queue, every_kind):
    """§2.4: ``list --state S`` for each state S of §2.1 names exactly that state's jobs."""
    complete = {s: every_kind[s] for s in ("pending", "claimed", "done", "failed")}
    ours = {*complete.values(), every_kind["incomplete"], every_kind["conflict"]}
    for state, job in complete.items():
        r = queue.run("list", "--state", state)
        assert r.rc in (0, 1), r
        assert job in r.out.split(), (state, r)
        others = (set(complete.values()) - {job}) & set(r.out.split())
        assert not others, (state, r)
        js = queue.run("list", "--state", state, "--json")
        assert js.rc in (0, 1), js
        text = json.dumps(js.json())
        assert job in text, (state, js)
        assert not [o for o in set(complete.values()) - {job} if o in text], (state, js)
    # §2.1: claimed is claimed/J/J *and* lease/J/worker; the claim without its lease is not
    assert every_kind["incomplete"] not in queue.run("list", "--state", "claimed").out
    everything = queue.run("list")
    for job in ours:
        assert job in everything.out, everything
    assert every_kind["ignored"] not in queue.run("list", "--state", "pending").out.split()


@pytest.mark.parametrize("state", ["pending", "claimed", "done", "failed"])
def test_s24_show_names_every_piece_of_evidence_in_each_state(queue, every_kind, state):
    """§2.4: ``show J`` — "every piece of evidence for J", by its path in the queue (§2.1)."""
    job = every_kind[state]
    evidence = {
        "pending": [f"pending/{job}"],
        "claimed": [f"claimed/{job}/{job}", f"lease/{job}/worker"],
        "done": [f"done/{job}", f"done/{job}.result"],
        "failed": [f"failed/{job}", f"failed/{job}.result"],
    }[state]
    for extra in ([], ["--json"]):
        r = queue.run("show", job, *extra)
        assert r.rc == 0, r
        if extra:
            r.json()
        for piece in evidence:
            assert piece in r.out, (piece, r)


def test_s24_show_of_a_conflict_names_both_sides(queue, every_kind):
    """Q-6: a conflict is "reported with every piece of evidence"; show of it too."""
    job = every_kind["conflict"]
    r = queue.run("show", job)
    assert r.rc in (0, 1), r
    for piece in (f"pending/{job}", f"done/{job}", f"done/{job}.result"):
        assert piece in r.out, (piece, r)


# --- the transitions of recover, in text and JSON -------------------------------------------


@pytest.mark.parametrize("json_flag", [False, True], ids=["text", "json"])
def test_q6_an_orphan_lease_is_reported_then_removed(queue, json_flag):
    """Q-6: "a lease without a claim" is an incomplete pair: plain recover reports it, changes
    nothing and exits 1; "an orphan lease/J with no request anywhere in claimed → removed" by
    --reconcile, exit 0; a second run changes nothing (I-5)."""
    job = orphan_lease(queue, "orph")
    # the donor claim (dead holder) is requeued by plain recover: take it out of the picture
    shutil.rmtree(queue.dir / "claimed" / ("orph-donor" + SUFFIX))
    shutil.rmtree(queue.dir / "lease" / ("orph-donor" + SUFFIX))
    long_ago(queue)
    extra = ["--json"] if json_flag else []
    before = deep_snapshot(queue.dir)
    plain = queue.run("recover", *extra)
    assert plain.rc == 1, plain
    assert job in plain.out + plain.err
    if json_flag:
        plain.json()
    assert deep_snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile", *extra)
    assert fixed.rc == 0, fixed
    if json_flag:
        fixed.json()
    assert not (queue.dir / "lease" / job).exists()
    after = snapshot(queue.dir)
    again = queue.run("recover", "--reconcile", *extra)
    assert again.rc == 0, again
    assert snapshot(queue.dir) == after


@pytest.mark.parametrize(
    "half", ["done/J.result", "failed/J.result", "done/J", "failed/J"], ids=str
)
@pytest.mark.parametrize("json_flag", [False, True], ids=["text", "json"])
def test_q6_half_a_terminal_pair_is_never_completed_or_removed(queue, half, json_flag):
    """Q-6: "a result without its terminal request" (and the request without its result) is
    an incomplete pair that no listed transition mends: plain recover and --reconcile report
    it, keep every file and exit 1."""
    job = "half" + SUFFIX
    (queue.dir / half.replace("J", job)).write_text(json.dumps(request()))
    long_ago(queue)
    extra = ["--json"] if json_flag else []
    before = deep_snapshot(queue.dir)
    for args in (["recover"], ["recover", "--reconcile"]):
        r = queue.run(*args, *extra)
        assert r.rc == 1, r
        assert job in r.out + r.err, r
        if json_flag:
            r.json()
        assert deep_snapshot(queue.dir) == before
    assert queue.run("publish", "--name", "half", "-", input=json.dumps(request())).rc == 1


def test_q6_a_claim_without_lease_beside_a_pending_copy_is_a_conflict(queue):
    """Q-6: the claim-without-lease transition may not replace pending evidence: J both pending
    and claimed is a conflict, reported, nothing moved, exit 1."""
    job = claim_without_lease(queue, "dup")
    (queue.dir / "pending" / job).write_text(json.dumps({"copy": 2}))
    long_ago(queue)
    before = deep_snapshot(queue.dir)
    r = queue.run("recover", "--reconcile")
    assert r.rc == 1, r
    assert job in r.out + r.err
    assert deep_snapshot(queue.dir) == before


def test_q5_a_dead_holders_claim_beside_a_terminal_pair_is_not_requeued(queue):
    """Q-5: requeue only when there is "no pending or terminal evidence for J"; J claimed and
    done at once is a conflict (Q-6), exit 1, nothing moved."""
    job = claimed_by_dead_holder(queue, "twice")
    queue.terminal("twice", "done")
    long_ago(queue)
    before = deep_snapshot(queue.dir)
    for args in (["recover"], ["recover", "--reconcile"]):
        r = queue.run(*args)
        assert r.rc == 1, r
        assert job in r.out + r.err
        assert deep_snapshot(queue.dir) == before


def test_q5_same_boot_and_pid_namespace_with_a_dead_pid_is_proof_whatever_the_host_name(queue):
    """Q-5: "same boot_id and same pid_ns, and the pid is dead" proves the holder gone (a
    host name may differ inside a container sharing the kernel and pid namespace)."""
    job = claimed_by_dead_holder(queue, "renamed")
    lease = queue.lease(job)
    lease["host"] = "a-container-name"
    queue.write_lease(job, lease)
    r = queue.run("recover")
    assert r.rc == 0, r
    assert queue.state(job) == "pending"


def test_q5_a_lease_not_yet_expired_from_another_host_stays(queue):
    """Q-5, N-1: liveness across hosts uses host/boot_id/expires_at, never a pid alone: an
    unexpired lease of another host stays, even with a pid that is dead here."""
    job = claimed_by_dead_holder(queue, "remote")
    lease = queue.lease(job)
    lease.update(host="remote.example", boot_id=str(uuid.uuid4()), pid_ns=lease["pid_ns"] + 7)
    queue.write_lease(job, lease)
    long_ago(queue)
    before = deep_snapshot(queue.dir)
    for args in (["recover"], ["recover", "--reconcile"]):
        r = queue.run(*args)
        assert r.rc in (0, 1), r
        assert deep_snapshot(queue.dir) == before
    lease["expires_at"] = PAST
    queue.write_lease(job, lease)
    r = queue.run("recover")
    assert r.rc == 0, r
    assert queue.state(job) == "pending"


@pytest.fixture
def wreck(queue):
    """Every situation recover acts on, at once: a dead holder's claim, a claim without a
    lease, a result beside its claimed request, an empty claim, an orphan lease, a stray temp,
    a conflict, and the ordinary states."""
    claimed_by_dead_holder(queue, "dead")
    rolled = claimed_by_dead_holder(queue, "rolled")
    (queue.dir / "done" / f"{rolled}.result").write_text(json.dumps({"status": "ok", "output": 1}))
    lease = orphan_lease(queue, "orph")
    assert (queue.dir / "lease" / lease / "worker").is_file()
    queue.drop("fine")
    queue.terminal("over", "done")
    claim_without_lease(queue, "nolease")
    (queue.dir / "claimed" / ("empty" + SUFFIX)).mkdir()
    (queue.dir / "inbox" / "stray.tmp").write_text("partial")
    queue.drop("clash")
    queue.terminal("clash", "failed")
    long_ago(queue)
    return queue


@pytest.mark.parametrize(
    "args",
    [
        ["recover", "--dry-run"],
        ["recover", "--dry-run", "--json"],
        ["recover", "--reconcile", "--dry-run"],
        ["recover", "--reconcile", "--dry-run", "--json", "--grace", "0"],
    ],
    ids=" ".join,
)
def test_q6_dry_run_changes_nothing_anywhere(wreck, args):
    """§2.4 ``--dry-run``: nothing changes — no file, directory, content, mode or time in the
    whole storage root; exit 1, since incomplete pairs and a conflict remain."""
    before = deep_snapshot(wreck.storage)
    r = wreck.run(*args)
    assert r.rc == 1, r
    if "--json" in args:
        r.json()
    assert deep_snapshot(wreck.storage) == before


def test_q6_reconcile_of_the_wreck_leaves_only_the_conflict_and_converges(wreck):
    """Q-6, I-5: --reconcile applies every safe transition at once; the conflict stays, so exit
    1; a second run changes nothing and says the same."""
    q = wreck
    first = q.run("recover", "--reconcile", "--json")
    assert first.rc == 1, first
    assert q.state("dead" + SUFFIX) == "pending"
    assert q.state("nolease" + SUFFIX) == "pending"
    assert q.state("rolled" + SUFFIX) == "done"
    assert not (q.dir / "claimed" / ("empty" + SUFFIX)).exists()
    assert not (q.dir / "lease" / ("orph" + SUFFIX)).exists()
    assert q.entries("inbox") == set()
    assert (q.dir / "pending" / ("clash" + SUFFIX)).is_file()
    assert (q.dir / "failed" / ("clash" + SUFFIX + ".result")).is_file()
    assert q.entries("claimed") == set()
    after = deep_snapshot(q.storage)
    second = q.run("recover", "--reconcile", "--json")
    assert second.rc == 1, second
    assert "clash" + SUFFIX in second.out
    assert deep_snapshot(q.storage) == after


@pytest.mark.parametrize(("grace", "removed"), [("0", True), ("3600", False)])
def test_q6_grace_bounds_which_temp_files_are_stray(queue, grace, removed):
    """Q-6: "stray temp files in inbox/ older than the grace period → removed"; --grace
    SECONDS sets the period."""
    temp = queue.dir / "inbox" / "left.tmp"
    temp.write_text("x")
    age(temp, 30)
    r = queue.run("recover", "--reconcile", "--grace", grace)
    assert r.rc == 0, r
    assert temp.exists() is not removed


# --- §2.4 work ----------------------------------------------------------------------------------


def test_s24_work_max_jobs_stops_after_n_claims(queue):
    """§2.4: ``work --max-jobs N``: the worker stops after N jobs; the rest stay pending.

    # reading: with no agent the claimed job is refused and finished in failed/ (§3 W-1).
    """
    jobs = [queue.publish(name=f"w{i}") for i in range(3)]
    r = queue.run("work", "--max-jobs", "1")
    assert r.rc == 0, r
    states = [queue.state(j) for j in jobs]
    assert states.count("pending") == 2, states
    assert states.count("failed") + states.count("done") == 1, states


# --- N-1 ----------------------------------------------------------------------------------------


def test_n1_a_queue_on_another_filesystem_works_by_its_path(tmp_path):
    """N-1: the protocol needs only mkdir exclusivity, no-replace rename or link, and fsync; a
    queue on another filesystem (tmpfs here) runs the whole job life."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    base = Path(os.path.realpath(shm)) / f"ctx-n1-{uuid.uuid4().hex}"
    try:
        qdir = base / "queue"
        env = clean_env(CTX_STORAGE=str(tmp_path / "root"))

        def q(*args, **kw):
            return ctx_run("queue", args[0], "--project", qdir, *args[1:], env=env, **kw)

        assert q("init").rc == 0
        assert q("publish", "--name", "n", "-", input=json.dumps(request())).rc == 0
        r = q("claim", "--pid", str(dead_pid()))
        assert (r.rc, r.out) == (0, "n.req.json\n"), r
        assert q("recover").rc == 0
        assert (qdir / "pending" / "n.req.json").is_file()
        assert q("claim").rc == 0
        assert q("finish", "n.req.json", "--ok").rc == 0
        assert (qdir / "done" / "n.req.json.result").is_file()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- with a SOURCE ------------------------------------------------------------------


def _hello_manifest(directory: Path) -> Path:
    return tool_manifest(directory, "hello", "#!/bin/sh\necho hello\n")


def test_r4_a_users_tier_is_home_uid_tool(storage, tmp_path):
    """R-4: "home/<uid>/ holds a user's tier: home/<uid>/tool/"; the root ABI is unchanged."""
    manifest = _hello_manifest(tmp_path / "m")
    r = ctx_run("object", "install", manifest, "--tier", "user", "--storage", storage)
    assert r.rc == 0, r
    endpoint = storage / "home" / str(os.getuid()) / "tool" / "hello"
    assert endpoint.is_file() and os.access(endpoint, os.X_OK)
    assert (endpoint.parent / "hello.d").is_dir()
    assert not (storage / "tool" / "hello").exists()
    assert set(os.listdir(storage)) == ROOT_ENTRIES


def test_r4_another_users_tier_is_under_their_own_uid(unprivileged_user, reachable_dir):
    """R-4 for a second uid on their own storage root: home/<their uid>/tool/."""
    user = unprivileged_user
    work = reachable_dir / "work"
    work.mkdir()
    os.chown(work, user.uid, user.gid)
    manifest = _hello_manifest(reachable_dir / "m")
    root = work / "root"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)}
    ctx = CTX_ARGV[0]
    done = run_as(user, [ctx, "bootstrap", "--storage", str(root)], env=env)
    assert done.returncode == 0, done
    done = run_as(
        user,
        [ctx, "object", "install", str(manifest), "--tier", "user", "--storage", str(root)],
        env=env,
    )
    assert done.returncode == 0, done
    assert (root / "home" / str(user.uid) / "tool" / "hello").is_file()
    assert set(os.listdir(root)) == ROOT_ENTRIES


def test_r5_bootstrap_from_a_source_installs_that_sources_manual_pages(tmp_path):
    """R-5: ``ctx bootstrap [SOURCE]``; D-1: the bundle mirrors SOURCE's docs/spec/*.md."""
    root = tmp_path / "root"
    r = ctx_run("bootstrap", "--storage", root, REPO)
    assert r.rc == 0, r
    docs = root / "shared" / "cortexfs-docs"
    for page in (REPO / "docs" / "spec").glob("ctx.*.md"):
        assert (docs / "man" / page.name).read_bytes() == page.read_bytes(), page.name
    assert set(os.listdir(root)) == ROOT_ENTRIES
    again = ctx_run("bootstrap", "--storage", root, REPO)
    assert again.rc == 0, again


# --- Q-5 with leases written from SPEC's field list alone ---------------------------------------


@pytest.mark.parametrize(
    ("case", "fields", "requeued"),
    [
        ("same-boot-dead-pid", {"pid": 4194303}, True),
        ("same-host-other-boot", {"boot_id": str(uuid.uuid4()), "pid": 1}, True),
        (
            "other-host-expired",
            {"host": "far.example", "boot_id": str(uuid.uuid4()), "pid_ns": 7, "expires_at": PAST},
            True,
        ),
        ("same-boot-live-pid", {"pid": 1}, False),
        (
            "other-host-dead-pid-unexpired",
            {"host": "far.example", "boot_id": str(uuid.uuid4()), "pid_ns": 7, "pid": 4194303},
            False,
        ),
        ("other-pid-ns-dead-pid-unexpired", {"pid_ns": 7, "pid": 4194303}, False),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_q5_liveness_of_a_lease_holding_only_specs_fields(queue, case, fields, requeued):
    """Q-3, Q-5, N-1: a lease of worker, host, boot_id, pid_ns, pid, claimed_at and expires_at
    is judged by Q-5's rules: same boot and pid namespace with a dead pid, the same host with
    another boot, or an expired lease prove the holder gone; nothing else does."""
    job = claim_without_lease(queue, case)
    (queue.dir / "lease" / job).mkdir()
    queue.write_lease(job, _spec_lease(**fields))
    long_ago(queue)
    request_bytes = (queue.dir / "claimed" / job / job).read_bytes()
    r = queue.run("recover")
    assert r.rc == 0, r
    if requeued:
        assert queue.state(job) == "pending", r
        assert (queue.dir / "pending" / job).read_bytes() == request_bytes
        assert not (queue.dir / "lease" / job).exists()
    else:
        assert queue.state(job) == "claimed", r


# --- names the queue makes, and init on a queue in use ------------------------------------------


def test_r3_names_publish_chooses_are_object_names(queue, tmp_path):
    """R-3, §2.1: a J that publish makes up (no --name, and each line of --batch) is an object
    name ending in .req.json."""
    single = queue.publish()
    batch = tmp_path / "b.jsonl"
    batch.write_text("".join(json.dumps(request(n=i)) + "\n" for i in range(3)))
    r = queue.run("publish", "--batch", batch)
    assert r.rc == 0, r
    for job in [single, *r.lines()]:
        assert job.endswith(SUFFIX) and is_object_name(job), job
        assert queue.state(job) == "pending"


def test_s24_init_of_a_queue_in_use_changes_no_job(queue):
    """R-5's "idempotent and never destroys user data" for the queue: init again, exit 0, every
    job where it was."""
    queue.drop("a")
    queue.claim()
    queue.drop("b")
    queue.terminal("c", "failed")
    before = snapshot(queue.dir)
    r = queue.run("init")
    assert r.rc == 0, r
    assert snapshot(queue.dir) == before


# --- I-4, I-5 under concurrency -------------------------------------------------------


def _start(queue: QueueCLI, *args: str, stdin: bytes = b"") -> subprocess.Popen:
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", args[0], "--project", queue.project, *args[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
    )
    proc.stdin.write(stdin)
    proc.stdin.close()
    proc.stdin = None  # communicate() must not flush it again
    return proc


def _finish_all(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append((proc.returncode, out.decode(), err.decode()))
    return done


def test_q1_concurrent_publishers_of_one_name_never_overwrite(queue):
    """Q-1: the move to pending/J is "without replacing": of publishers racing for one name
    exactly one wins; the others are refused with EEXIST and pending/J is the winner's."""
    procs = [
        _start(queue, "publish", "--name", "race", "-", stdin=json.dumps(request(n=i)).encode())
        for i in range(6)
    ]
    results = _finish_all(procs)
    winners = [i for i, (rc, _, _) in enumerate(results) if rc == 0]
    assert len(winners) == 1, results
    for i, (rc, _out, err) in enumerate(results):
        if i != winners[0]:
            assert rc == 1 and "EEXIST" in err, results
    stored = json.loads((queue.dir / "pending" / ("race" + SUFFIX)).read_text())
    assert stored["n"] == winners[0]
    assert queue.entries("inbox") == set()


def test_q4_concurrent_finishes_leave_one_terminal_pair(queue):
    """Q-4, Q-6: finishes racing for one job (one --ok, one --error) never make two results:
    exactly one succeeds and its pair is the only evidence left."""
    for _ in range(3):
        job = queue.publish()
        assert queue.claim() == job
        procs = [
            _start(queue, "finish", job, flag, "-", stdin=json.dumps({"by": flag}).encode())
            for flag in ("--ok", "--error", "--ok", "--error")
        ]
        results = _finish_all(procs)
        assert [rc for rc, _, _ in results].count(0) == 1, results
        assert all(rc in (0, 1) for rc, _, _ in results), results
        states = [s for s in ("done", "failed") if (queue.dir / s / f"{job}.result").exists()]
        assert len(states) == 1, results
        assert queue.state(job) == states[0]
        assert not (queue.dir / "claimed" / job).exists()
        assert not (queue.dir / "lease" / job).exists()


def test_i4_reconcile_racing_claims_never_requeues_a_job_a_claim_reported(queue, child):
    """I-4, Q-3, Q-6: ``recover --reconcile`` run again and again while claims run never puts
    back in pending a job whose claim was reported (its holder alive), so nobody else can
    claim it: every job ends claimed once, by one claimer."""
    jobs = [queue.publish(name=f"r{i:02d}") for i in range(24)]
    claimers = [_start(queue, "claim", "--pid", str(child.pid)) for _ in range(24)]
    recoverers = []
    for _ in range(6):
        # (the default grace: --grace 0 calls every temp file stray, a claim's own lease temp
        # included, and that claim is then refused with its job left pending)
        recoverers.append(_start(queue, "recover", "--reconcile"))
    claimed = _finish_all(claimers)
    recovered = _finish_all(recoverers)
    assert [r for r in recovered if r[0] not in (0, 1)] == []
    names = [out.strip() for rc, out, _ in claimed if rc == 0]
    assert [c for c in claimed if c[0] not in (0, 3)] == []
    assert len(names) == len(set(names)), names
    for job in names:
        assert queue.state(job) == "claimed", (job, queue.entries("pending"))
    # whatever a claim lost to the race is still pending: nothing lost
    for job in set(jobs) - set(names):
        assert queue.state(job) == "pending", job
    final = queue.run("recover", "--reconcile")
    assert final.rc == 0, final


def test_i5_concurrent_reconciles_converge_like_one(wreck):
    """I-5: several ``recover --reconcile`` at once end where one would: every job in exactly
    one state, the conflict kept, and a last run changes nothing."""
    q = wreck
    results = _finish_all([_start(q, "recover", "--reconcile") for _ in range(4)])
    assert all(rc in (0, 1) for rc, _, _ in results), results
    assert q.state("dead" + SUFFIX) == "pending"
    assert q.state("nolease" + SUFFIX) == "pending"
    assert q.state("rolled" + SUFFIX) == "done"
    assert q.state("fine" + SUFFIX) == "pending"
    assert q.entries("claimed") == set()
    assert q.entries("lease") == set()
    assert (q.dir / "pending" / ("clash" + SUFFIX)).is_file()
    after = deep_snapshot(q.storage)
    last = q.run("recover", "--reconcile")
    assert last.rc == 1, last
    assert deep_snapshot(q.storage) == after


# --- R-3 for the other objects: tools, agents, models -------------------------------------------


def _tool_manifest_named(directory: Path, name: str) -> Path:
    manifest = _hello_manifest(directory)
    document = json.loads(manifest.read_text())
    document["name"] = name
    manifest.write_text(json.dumps(document))
    return manifest


@pytest.mark.parametrize(
    ("name", "legal"),
    [("t" * 64, True), ("t" * 65, False), ("x.d", False), (".x", False), ("a b", False)],
    ids=["64-bytes", "65-bytes", "ends-in-.d", "dot-first", "space"],
)
def test_r3_tool_names_at_the_boundaries(storage, tmp_path, name, legal):
    """R-3: a tool name is an object name; anything else is EINVAL (T-8 ``object check``)."""
    manifest = _tool_manifest_named(tmp_path / "m", name)
    r = ctx_run("object", "check", manifest, env=clean_env(CTX_STORAGE=str(storage)))
    if legal:
        assert r.rc == 0, r
    else:
        assert r.rc in (1, 2), r
        assert "EINVAL" in r.out + r.err, r


@pytest.mark.parametrize(
    ("name", "model", "legal"),
    [
        ("a" * 64, "openai/gpt-4o", True),
        ("a" * 65, "openai/gpt-4o", False),
        ("agent.d", "openai/gpt-4o", False),
        ("-agent", "openai/gpt-4o", False),
        ("agent1", "openai", False),
        ("agent2", "a/b/c", False),
        ("agent3", "openai/.hidden", False),
        ("agent4", "openai/m.d", False),
        ("agent5", "/gpt", False),
        ("agent6", "p" * 64 + "/" + "m" * 64, True),
    ],
    ids=[
        "agent-64",
        "agent-65",
        "agent-.d",
        "agent-dash-first",
        "model-no-slash",
        "model-two-slashes",
        "model-dot-first",
        "model-.d",
        "model-empty-provider",
        "model-64-and-64",
    ],
)
def test_r3_agent_and_model_names_at_the_boundaries(storage, tmp_path, name, model, legal):
    """R-3: agent names are object names; "Model names are <provider>/<model>, each part an
    object name"; anything else is EINVAL and creates nothing."""
    spec = tmp_path / "agent.json"
    spec.write_text(json.dumps({"name": name, "label": "x_t", "model": [model], "tools": []}))
    before = set(os.listdir(storage / "agent"))
    r = ctx_run("agent", "create", spec, "--storage", storage)
    if legal:
        assert r.rc == 0, r
        assert name in os.listdir(storage / "agent")
    else:
        assert r.rc in (1, 2), r
        assert "EINVAL" in r.err, r
        assert set(os.listdir(storage / "agent")) == before


# --- Q-8 in the staging directory, and a queue that is not there ---------------------------------


def test_q8_reconcile_removes_only_regular_temp_files_from_the_staging_directory(queue, tmp_path):
    """Q-6, Q-8: "stray temp files in inbox/ older than the grace period → removed"; a symlink,
    a directory or a FIFO there is not a temp file: never followed, never removed."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    inbox = queue.dir / "inbox"
    (inbox / "link.tmp").symlink_to(target)
    (inbox / "dir.tmp").mkdir()
    (inbox / "dir.tmp" / "inside").write_text("keep")
    os.mkfifo(inbox / "fifo.tmp")
    (inbox / "stale.tmp").write_text("half a request")
    for entry in inbox.iterdir():
        age(entry, DAY)
    r = queue.run("recover", "--reconcile")
    assert r.rc == 0, r
    assert set(os.listdir(inbox)) == {"link.tmp", "dir.tmp", "fifo.tmp"}
    assert target.read_text() == "keep me"
    assert (inbox / "dir.tmp" / "inside").read_text() == "keep"


@pytest.mark.parametrize(
    "args",
    [["status"], ["list"], ["claim"], ["recover", "--reconcile"], ["show", "j"], ["publish", "-"]],
    ids=" ".join,
)
def test_s24_a_project_without_a_queue_is_refused_and_nothing_is_made(storage, args):
    """§2.4: "1 operation refused": a queue command on a project that has no queue (only
    ``init`` makes one) is refused, makes nothing, and is never "nothing to claim"."""
    before = deep_snapshot(storage)
    r = QueueCLI(storage, "nosuch").run(*args, input=json.dumps(request()))
    assert r.rc == 1, r
    assert deep_snapshot(storage) == before


def test_s24_claim_for_a_pid_that_does_not_exist_still_prints_j_alone(queue):
    """§2.4: "In text mode publish and claim print the job name J alone on its own line (and
    nothing else on stdout)" — whatever the claim has to say goes elsewhere."""
    job = queue.drop("gone-holder")
    r = queue.run("claim", "--pid", str(dead_pid()), "--worker", "w-1", "--ttl", "60")
    assert (r.rc, r.out) == (0, job + "\n"), r


def test_q3_the_lease_records_the_holders_start_time(queue, child):
    """Q-3: the lease holds "the process start time (psutil create_time)" of its holder.

    # reading: the field's name is not fixed; some number in the lease is that start time.
    """
    psutil = pytest.importorskip("psutil")
    job = queue.drop("timed")
    assert queue.claim("--pid", str(child.pid)) == job
    lease = queue.lease(job)
    started = psutil.Process(child.pid).create_time()
    numbers = [v for v in lease.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert any(abs(v - started) < 0.05 for v in numbers), lease
    assert lease["pid"] == child.pid


# --- the order of renames and fsyncs, as the kernel sees it ---------------------------------

_SYSCALL = re.compile(r"^\d+\s+(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+)")
_FD_PATH = re.compile(r"^-?\d+<(?P<path>[^>]*)>$")


def _split_args(args: str) -> list[str]:
    """strace's argument list, split at top-level commas."""
    parts, depth, quoted, current = [], 0, False, ""
    for i, ch in enumerate(args):
        if ch == '"' and (i == 0 or args[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "<[{":
            depth += 1
        elif not quoted and ch in ">]}":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts


def _fd_path(arg: str) -> str | None:
    m = _FD_PATH.match(arg)
    return m.group("path") if m else None


def _traced(queue: QueueCLI, *args: str, stdin: str = "") -> list[tuple[str, list[str]]]:
    """``ctx queue ARGS`` under strace: its successful fsync, rename, link, unlink and rmdir
    calls and its writes to standard output, in order, with fds shown as paths."""
    log = queue.storage.parent / f"strace-{uuid.uuid4().hex}.log"
    argv = [
        "strace",
        "-f",
        "-y",
        "-qq",
        "-s",
        "256",
        "-o",
        str(log),
        "-e",
        "trace=fsync,fdatasync,rename,renameat,renameat2,link,linkat,unlink,unlinkat,rmdir,write",
        *CTX_ARGV,
        "queue",
        args[0],
        "--project",
        queue.project,
        *args[1:],
    ]
    done = subprocess.run(
        argv,
        input=stdin.encode(),
        capture_output=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        timeout=60,
    )
    assert done.returncode == 0, done
    calls = []
    for line in trace_lines(log):
        m = _SYSCALL.match(line)
        if m and int(m.group("ret")) >= 0:
            calls.append((m.group("call"), _split_args(m.group("args"))))
    return calls


def _durability_faults(queue: QueueCLI, calls: list[tuple[str, list[str]]]) -> list[str]:
    """Q-7: after every rename, link, unlink or rmdir in the queue, every affected parent
    directory is fsynced before the command reports (its first write to stdout, else its
    end); a file renamed or linked into place was fsynced first."""
    top = str(queue.dir)
    report = next(
        (i for i, (call, a) in enumerate(calls) if call == "write" and a[0].startswith("1<")),
        len(calls),
    )
    synced_at: dict[str, list[int]] = {}
    for i, (call, a) in enumerate(calls):
        if call in ("fsync", "fdatasync") and _fd_path(a[0]):
            synced_at.setdefault(_fd_path(a[0]), []).append(i)
    faults = []
    for i, (call, a) in enumerate(calls):
        if call in ("renameat2", "renameat", "linkat"):
            src_dir, src, dst_dir = _fd_path(a[0]), a[1].strip('"'), _fd_path(a[2])
            parents = [src_dir, dst_dir] if call != "linkat" else [dst_dir]
            if src_dir and src_dir.startswith(top + "/inbox"):
                temp = f"{src_dir}/{src}"
                if not any(j < i for j in synced_at.get(temp, [])):
                    faults.append(f"{call} of {temp} before it was fsynced")
        elif call == "unlinkat":
            parents = [_fd_path(a[0])]
        else:
            continue
        for parent in parents:
            if (
                parent
                and parent.startswith(top)
                and not any(i < j < report for j in synced_at.get(parent, []))
            ):
                faults.append(f"{call} {a[:4]}: {parent} not fsynced after it")
    return faults


@pytest.fixture
def strace_available():
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run(["strace", "-qq", "-e", "trace=none", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr!r}")


def test_q7_publish_and_claim_sync_every_parent_before_reporting(queue, strace_available):
    """Q-1, Q-3, Q-7: the request and the lease are fsynced before they move into place;
    every directory a move touches is fsynced before J is printed."""
    calls = _traced(queue, "publish", "--name", "traced", "-", stdin=json.dumps(request()))
    assert any(c == "renameat2" or c == "linkat" for c, _ in calls), calls
    assert _durability_faults(queue, calls) == []
    calls = _traced(queue, "claim", "--pid", str(os.getpid()))
    assert _durability_faults(queue, calls) == []


@pytest.mark.parametrize("command", ["finish", "recover"])
def test_q7_finish_and_requeue_sync_every_parent_before_reporting(queue, strace_available, command):
    """Q-4, Q-5, Q-7: finish and recover's requeue, each rename and removal followed by an
    fsync of every directory it touched."""
    job = queue.publish(name="traced")
    if command == "finish":
        assert queue.claim("--pid", str(os.getpid())) == job
        calls = _traced(queue, "finish", job, "--ok", "-", stdin='{"ok": 1}')
    else:
        assert queue.claim("--pid", str(dead_pid())) == job
        calls = _traced(queue, "recover")
        assert queue.state(job) == "pending"
    assert _durability_faults(queue, calls) == []


def test_q9_jobs_of_one_age_are_claimed_in_name_order(queue):
    """Q-9: oldest first "by publish time, name as tie-break": requests put in pending/ by
    hand with one and the same time are claimed in name order."""
    names = ["zz", "bb", "aa", "mm"]
    for name in names:
        queue.drop(name)
    stamp = time.time() - DAY
    for name in names:
        os.utime(queue.dir / "pending" / (name + SUFFIX), (stamp, stamp))
    claimed = [queue.claim("--pid", str(os.getpid())) for _ in names]
    assert claimed == [n + SUFFIX for n in sorted(names)]
