"""The queue command line of SPEC §2.4, through real subprocesses: outputs and exit statuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from tests.queue.helpers import PROJECT, dead_pid, request, write_json
from tests.support.cli import ctx

HOST = os.uname().nodename

P = ("--project", PROJECT)


@pytest.fixture
def root(root: Path) -> Path:
    """The root of conftest.py (its ABI alone), with the queue ``ctx queue init`` makes."""
    assert ctx(root, "queue", "init", *P).returncode == 0
    return root


@pytest.fixture
def req(tmp_path: Path) -> Path:
    return write_json(tmp_path / "req.json", request(1))


def qdir(root: Path) -> Path:
    return root / "shared" / PROJECT / "queue"


def test_init_makes_the_root_abi_and_the_queue(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    root.mkdir()
    done = ctx(root, "queue", "init", *P)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(root)) == ["agent", "bin", "home", "model", "shared", "tool"]
    assert sorted(os.listdir(qdir(root))) == sorted(
        ["config", "inbox", "pending", "lease", "claimed", "done", "failed"]
    )
    space = root / "shared" / PROJECT  # a whole shared space, as ctx shared create makes
    assert sorted(os.listdir(space)) == ["agent", "data", "queue", "tool"]
    modes = {d: os.stat(space / d).st_mode & 0o7777 for d in ("", *os.listdir(space))}
    assert modes == {"": 0o3770, "agent": 0o3770, "data": 0o2770, "queue": 0o3770, "tool": 0o2750}
    assert ctx(root, "queue", "init", *P).returncode == 0  # idempotent


def test_a_queue_a_umask_shares_with_its_group_gets_setgid_state_directories(
    tmp_path: Path,
) -> None:
    """``queue init --queue`` under ``umask 002`` makes a group-writable queue: its state
    directories are made setgid with the queue's group (what members make there is the
    group's), so neither init nor status warns about what init itself made."""
    root, queue = tmp_path / "storage", tmp_path / "q"  # a queue outside the storage root
    done = ctx(root, "queue", "init", "--queue", str(queue), umask=0o002)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    for state in ("inbox", "pending", "lease", "claimed", "done", "failed"):
        assert os.stat(queue / state).st_mode & 0o7777 == 0o2775, state
    status = ctx(root, "queue", "status", "--queue", str(queue), "--json")
    assert json.loads(status.stdout)["group_not_inherited"] == [], status.stdout
    private = tmp_path / "private"  # a umask of 022: no group may write, nothing setgid
    assert ctx(root, "queue", "init", "--queue", str(private), umask=0o022).returncode == 0
    assert os.stat(private / "pending").st_mode & 0o7777 == 0o755


def test_publish_prints_the_name_alone(root: Path, req: Path) -> None:
    done = ctx(root, "queue", "publish", *P, "--name", "build-1", str(req))
    assert (done.returncode, done.stdout) == (0, "build-1.req.json\n")
    done = ctx(
        root, "queue", "publish", *P, "--name", "build-2.req.json", "-", stdin=req.read_text()
    )
    assert (done.returncode, done.stdout) == (0, "build-2.req.json\n")
    auto = ctx(root, "queue", "publish", *P, str(req))
    assert auto.returncode == 0 and auto.stdout.strip().endswith(".req.json")
    assert len(auto.stdout.splitlines()) == 1
    assert sorted(os.listdir(qdir(root) / "pending")) == sorted(
        ["build-1.req.json", "build-2.req.json", auto.stdout.strip()]
    )


def test_publish_json_output(root: Path, req: Path) -> None:
    done = ctx(root, "queue", "publish", *P, "--name", "j", "--json", str(req))
    assert json.loads(done.stdout) == {"name": "j.req.json"}


def test_publishing_a_known_name_is_refused_with_eexist(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "dup", str(req))
    done = ctx(root, "queue", "publish", *P, "--name", "dup", str(req))
    assert done.returncode == 1 and done.stdout == ""
    assert "EEXIST" in done.stderr and "dup.req.json" in done.stderr


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("not json", "not JSON"),
        ("[1]", "one JSON object"),
        ('{"tool": "x"}', "'input'"),
        ('{"input": {}}', "'tool'"),
        (b"\xff\xfe".decode("latin-1"), "JSON"),
        ('{"tool": "x", "input": {}, "created": "yesterday"}', "RFC 3339"),
        ('{"tool": "x", "input": {}, "from": 7}', "'from'"),
    ],
)
def test_invalid_requests_are_refused_and_leave_nothing(root: Path, body: str, needle: str) -> None:
    done = ctx(root, "queue", "publish", *P, "-", stdin=body)
    assert done.returncode == 1 and "EINVAL" in done.stderr and needle in done.stderr
    assert done.stdout == ""
    assert os.listdir(qdir(root) / "pending") == [] and os.listdir(qdir(root) / "inbox") == []


def test_an_oversize_request_is_refused(root: Path, tmp_path: Path) -> None:
    big = write_json(tmp_path / "big.json", request(pad="x" * (1024 * 1024)))
    done = ctx(root, "queue", "publish", *P, str(big))
    assert done.returncode == 1 and "EFBIG" in done.stderr
    assert os.listdir(qdir(root) / "pending") == []


def request_of_size(size: int, newline: bool = True) -> bytes:
    """A valid request of exactly ``size`` bytes, as a file holds it (with a final newline)."""
    end = b"\n" if newline else b""
    empty = json.dumps(request(1, pad="")).encode() + end
    data = json.dumps(request(1, pad="x" * (size - len(empty)))).encode() + end
    assert len(data) == size
    return data


def test_a_request_of_exactly_the_limit_is_accepted_stored_and_claimed(
    root: Path, tmp_path: Path
) -> None:
    """§2.1: requests *larger* than the limit (1 MiB) are refused; the size is that of the
    bytes given, although the stored request gains 'from' and 'created'."""
    exact = tmp_path / "exact.json"
    exact.write_bytes(request_of_size(1024 * 1024))
    over = tmp_path / "over.json"
    over.write_bytes(request_of_size(1024 * 1024 + 1))

    refused = ctx(root, "queue", "publish", *P, "--name", "over", str(over))
    published = ctx(root, "queue", "publish", *P, "--name", "exact", str(exact))
    claimed = ctx(root, "queue", "claim", *P, "--json")

    assert refused.returncode == 1 and "EFBIG" in refused.stderr
    assert "1048577 bytes" in refused.stderr and "at most 1048576" in refused.stderr
    assert published.returncode == 0, published.stderr
    stored = qdir(root) / "claimed" / "exact.req.json" / "exact.req.json"
    assert stored.stat().st_size > 1024 * 1024  # 'from' and 'created' were added
    got = json.loads(claimed.stdout)["request"]
    assert "invalid" not in got and len(got["pad"]) > 1_000_000 and got["from"]


def test_a_batch_line_of_exactly_the_limit_is_accepted(root: Path) -> None:
    line = request_of_size(1024 * 1024, newline=False).decode()
    big = request_of_size(1024 * 1024 + 1, newline=False).decode()
    done = ctx(root, "queue", "publish", *P, "--batch", "-", stdin=line + "\n" + line + "\n")
    refused = ctx(root, "queue", "publish", *P, "--batch", "-", stdin=big + "\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 2
    assert refused.returncode == 1 and "1048577 bytes" in refused.stderr


def compact_request_of_size(size: int) -> bytes:
    """A compact request of exactly ``size`` bytes that JSON re-encoding would make larger:
    a long list of small numbers ("0,0,…", where the default separator is ", ") and escapes
    that stand for characters ("\\u00e9"), as a program writing compact JSON gives them."""
    head, tail = b'{"tool":"fs.list","input":{"s":"\\u00e9\\ud800","n":[', b"]}}"
    count = (size - len(head) - len(tail) + 1) // 2
    data = head + b",".join([b"0"] * count) + tail
    return data + b" " * (size - len(data))


@pytest.mark.parametrize("batch", [False, True])
def test_a_compact_request_under_the_limit_is_stored_no_larger_than_given(
    root: Path, tmp_path: Path, batch: bool
) -> None:
    """§2.1: the 1 MiB limit is on the request as given, and what is stored is the request
    as given ('from' and 'created' put in front), not a re-encoding of it that may be larger
    than the limit allows."""
    given = compact_request_of_size(1_027_852)
    source = tmp_path / "compact.json"
    source.write_bytes(given + b"\n")
    args = ("--batch",) if batch else ("--name", "compact")
    done = ctx(root, "queue", "publish", *P, *args, str(source))
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    stored = (qdir(root) / "pending" / job).read_bytes()
    assert len(stored) <= len(given) + 200  # 'from' and 'created'
    assert stored.rstrip(b"\n").endswith(given.rstrip()[1:])  # the rest byte for byte
    claimed = ctx(root, "queue", "claim", *P, "--json")
    got = json.loads(claimed.stdout)["request"]
    assert "invalid" not in got and got["input"]["s"] == "\u00e9\ud800" and got["from"]
    assert got["input"]["n"] == json.loads(given)["input"]["n"]


def test_an_illegal_name_is_a_usage_error(root: Path, req: Path) -> None:
    done = ctx(root, "queue", "publish", *P, "--name", "../escape", str(req))
    assert done.returncode == 2 and "EINVAL" in done.stderr


def test_a_missing_request_file_is_refused(root: Path, tmp_path: Path) -> None:
    done = ctx(root, "queue", "publish", *P, str(tmp_path / "nope.json"))
    assert done.returncode == 1 and "ENOENT" in done.stderr


def test_batch_prints_each_name(root: Path, tmp_path: Path) -> None:
    lines = [json.dumps(request(n)) for n in range(5)]
    batch = tmp_path / "b.jsonl"
    batch.write_text("\n".join(lines) + "\n\n")
    done = ctx(root, "queue", "publish", *P, "--batch", str(batch))
    assert done.returncode == 0
    names = done.stdout.split()
    assert len(names) == 5 and sorted(names) == sorted(os.listdir(qdir(root) / "pending"))


def test_a_batch_with_a_bad_line_publishes_nothing(root: Path) -> None:
    body = json.dumps(request(0)) + "\n{broken\n" + json.dumps(request(2)) + "\n"
    done = ctx(root, "queue", "publish", *P, "--batch", "-", stdin=body)
    assert done.returncode == 1 and "line 2" in done.stderr and done.stdout == ""
    assert os.listdir(qdir(root) / "pending") == []


def in_shell(root: Path, shell: str, script: str) -> subprocess.CompletedProcess[str]:
    """``SHELL -c SCRIPT`` against storage root ``root``: commands run from a shell script,
    whose processes (the shell, the commands it starts or execs) are the lease holders."""
    return subprocess.run(
        [shell, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
    )


def test_claim_prints_the_name_and_leases_to_the_calling_process(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "c", str(req))
    script = f'{sys.executable} -m cortexfs queue claim --project {PROJECT}; echo "shell=$$"'
    done = in_shell(root, "sh", script)
    job, shell = done.stdout.split()
    assert job == "c.req.json"
    lease = json.loads((qdir(root) / "lease" / job / "worker").read_text())
    assert lease["pid"] == int(shell.removeprefix("shell="))


@pytest.mark.parametrize("wrapper", ["timeout 60", "flock {lock}"])
def test_a_claim_run_through_a_wrapper_leases_to_the_shell_not_the_wrapper(
    root: Path, req: Path, tmp_path: Path, wrapper: str
) -> None:
    """``timeout``/``flock`` run the claim and end with it: a lease naming them would be
    found gone at once, and recover would requeue the job while the shell works on it."""
    ctx(root, "queue", "publish", *P, "--name", "w", str(req))
    command = wrapper.format(lock=tmp_path / "lock")
    script = (
        f'J=$({command} {sys.executable} -m cortexfs queue claim --project {PROJECT}); echo "$J"; '
        f"{sys.executable} -m cortexfs queue recover --project {PROJECT} --json; "
        'echo "shell=$$"'
    )
    done = in_shell(root, "sh", script)

    job, recovered, shell = done.stdout.splitlines()
    assert job == "w.req.json", done.stderr
    lease = json.loads((qdir(root) / "lease" / job / "worker").read_text())
    assert lease["pid"] == int(shell.removeprefix("shell="))
    assert json.loads(recovered)["requeued"] == [], recovered  # the shell was alive


def test_a_script_that_runs_the_claim_it_was_given_is_its_holder(
    root: Path, req: Path, tmp_path: Path
) -> None:
    """Only wrapper programs that wait (timeout, flock…) are passed over: a script run by its
    path that claims with the command line it was given goes on working, and renews."""
    ctx(root, "queue", "publish", *P, "--name", "s", str(req))
    script = tmp_path / "claim-and-work"
    renew = f"{sys.executable} -m cortexfs queue renew --project {PROJECT}"
    script.write_text(f'#!/bin/sh\nJ=$("$@") || exit 9\n{renew} "$J" >&2 || exit 8\necho "$$ $J"\n')
    script.chmod(0o755)
    claim = [sys.executable, "-m", "cortexfs", "queue", "claim", *P]
    done = subprocess.run(
        [script, *claim],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
    )

    assert done.returncode == 0, done.stderr
    shell, job = done.stdout.split()
    assert json.loads((qdir(root) / "lease" / job / "worker").read_text())["pid"] == int(shell)


def test_a_wrapper_whose_starter_is_gone_is_the_holder_not_init(root: Path, req: Path) -> None:
    """``(timeout 60 ctx queue claim &)``: init adopts the wrapper at once; a lease naming
    pid 1 would never be found gone."""
    ctx(root, "queue", "publish", *P, "--name", "i", str(req))
    claim = f"timeout 60 {sys.executable} -m cortexfs queue claim --project {PROJECT}"
    assert in_shell(root, "sh", f"({claim} >/dev/null 2>&1 &)").returncode == 0
    worker = qdir(root) / "lease" / "i.req.json" / "worker"
    deadline = time.monotonic() + 30
    while not worker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # written, not only made

    assert json.loads(worker.read_text())["pid"] > 1


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("unshare"),
    reason="entering a pid namespace needs root, nsenter and unshare",
)
def test_a_claim_whose_caller_is_outside_its_pid_namespace_asks_for_pid(
    root: Path, req: Path
) -> None:
    """``docker exec``/``nsenter -p``: the parent has no pid in the claim's namespace."""
    ctx(root, "queue", "publish", *P, "--name", "n", str(req))
    namespace = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while (
            not (inner := psutil.Process(namespace.pid).children()) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        enter = ["nsenter", "-t", str(inner[0].pid), "-p", "-m", "--"]
        done = subprocess.run(
            [*enter, sys.executable, "-m", "cortexfs", "queue", "claim", *P],
            capture_output=True,
            text=True,
            env={**os.environ, "CTX_STORAGE": str(root)},
        )
    finally:
        namespace.kill()
        namespace.wait()

    assert done.returncode == 2, done.stderr
    assert "outside this pid namespace" in done.stderr and "--pid" in done.stderr
    assert os.listdir(qdir(root) / "pending") == ["n.req.json"]


def test_claim_json_and_options(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "cj", str(req))
    done = ctx(root, "queue", "claim", *P, "--json", "--pid", str(os.getpid()), "--ttl", "42",
               "--worker", "w-1")  # fmt: skip
    claimed = json.loads(done.stdout)
    assert claimed["name"] == "cj.req.json" and claimed["request"]["input"] == {"n": 1}
    assert claimed["lease"]["pid"] == os.getpid() and claimed["lease"]["worker"] == "w-1"


def test_a_claim_whose_lease_expired_before_it_returned_gives_its_period_as_the_lease_has_it(
    root: Path, req: Path
) -> None:
    """A microsecond's lease (the stamps' resolution) is said as 1e-06 s, not as the float
    its two stamps' difference makes."""
    ctx(root, "queue", "publish", *P, "--name", "short", str(req))
    done = ctx(root, "queue", "claim", *P, "--ttl", "0.000001")
    assert done.returncode == 1, done.stderr
    assert "its lease of 1e-06 s expired before the claim returned" in done.stderr, done.stderr


def test_claim_on_an_empty_queue_exits_3_silently(root: Path) -> None:
    done = ctx(root, "queue", "claim", *P)
    assert (done.returncode, done.stdout) == (3, "")
    as_json = ctx(root, "queue", "claim", *P, "--json")  # §2.4: "or nothing with exit 3"
    assert (as_json.returncode, as_json.stdout, as_json.stderr) == (3, "", "")


@pytest.mark.parametrize("pid", ["999999", "dead"])
def test_claim_for_a_pid_that_does_not_exist_builds_a_dead_holder(
    root: Path, req: Path, pid: str
) -> None:
    """§2.4 puts no restriction on --pid: the lease names that pid, with no start time, and
    recover finds its holder gone.  A note on stderr says so, in case the pid was mistyped."""
    pid = str(dead_pid()) if pid == "dead" else pid
    assert not Path(f"/proc/{pid}").exists()
    ctx(root, "queue", "publish", *P, "--name", "d", str(req))
    done = ctx(root, "queue", "claim", *P, "--pid", pid)
    assert (done.returncode, done.stdout) == (0, "d.req.json\n")
    lease = json.loads((qdir(root) / "lease" / "d.req.json" / "worker").read_text())
    assert lease["pid"] == int(pid) and lease["create_time"] is None
    assert done.stderr == (
        f"ctx: note: pid {pid} on {lease['host']} has exited, so its lease is already gone: "
        f"'ctx queue recover --project {PROJECT}' requeues d.req.json\n"
    )
    recovered = ctx(root, "queue", "recover", *P)
    assert recovered.returncode == 0 and "requeue  d.req.json" in recovered.stdout
    assert os.listdir(qdir(root) / "pending") == ["d.req.json"]


def test_claim_for_a_pid_that_cannot_be_one_is_a_usage_error(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, str(req))
    done = ctx(root, "queue", "claim", *P, "--pid", "0")
    assert done.returncode == 2 and "EINVAL" in done.stderr
    assert len(os.listdir(qdir(root) / "pending")) == 1


def test_renew_is_for_the_holder_only(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "r", str(req))
    me = str(os.getpid())
    ctx(root, "queue", "claim", *P, "--pid", me, "--ttl", "5")
    done = ctx(root, "queue", "renew", *P, "r", "--pid", me, "--ttl", "600", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["pid"] == os.getpid()
    other = ctx(root, "queue", "renew", *P, "r")  # the holder would be pytest's ctx parent: us?
    assert other.returncode == 0  # ctx's parent is this test process, the holder
    renew = f"{sys.executable} -m cortexfs queue renew --project {PROJECT} r"
    # A shell that goes on after the renew is its caller (one that only ran it, 'sh -c RENEW',
    # would be passed over for the process that started it: this one, the holder).
    stranger = in_shell(root, "sh", f"{renew}; exit $?")
    assert stranger.returncode == 1 and "EACCES" in stranger.stderr


def test_renew_by_a_shell_that_execs_it_in_its_own_process(root: Path, req: Path) -> None:
    """bash runs the last command of ``bash -c 'claim && renew'`` in its own process: the
    renew is then the shell the claim leased for, and the holder renews."""
    ctx(root, "queue", "publish", *P, "--name", "x", str(req))
    queue = f"{sys.executable} -m cortexfs queue"
    claim = f"{queue} claim --project {PROJECT} --ttl 10"
    script = f"{claim} && {queue} renew --project {PROJECT} x --ttl 1000"
    done = in_shell(root, "bash", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("x.req.json\nx.req.json leased until ")
    lease = json.loads((qdir(root) / "lease" / "x.req.json" / "worker").read_text())
    left = datetime.fromisoformat(lease["expires_at"]) - datetime.now(UTC)
    assert left.total_seconds() > 900
    # That process was the holder and has ended with the renew: it says so, and recover
    # does what it says.
    assert f"'ctx queue recover --project {PROJECT}' will requeue x.req.json" in done.stderr
    recovered = ctx(root, "queue", "recover", *P)
    assert recovered.returncode == 0 and "requeue  x.req.json" in recovered.stdout


def test_finish_ok_with_a_json_result(root: Path, req: Path, tmp_path: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "f", str(req))
    ctx(root, "queue", "claim", *P)
    result = write_json(tmp_path / "result.json", {"lines": 3})
    done = ctx(root, "queue", "finish", *P, "f", "--ok", str(result))
    assert (done.returncode, done.stdout) == (0, "f.req.json\n")
    stored = json.loads((qdir(root) / "done" / "f.req.json.result").read_text())
    assert stored["status"] == "ok" and stored["output"] == {"lines": 3}


def test_the_result_names_the_lease_holder_as_its_worker(root: Path, req: Path) -> None:
    """SPEC §2.1 result ``worker``: who held the job (the claim's --worker and --pid), not
    whichever process ran ``finish``."""
    holder = subprocess.Popen(["sleep", "60"])
    try:
        ctx(root, "queue", "publish", *P, "--name", "w", str(req))
        claimed = ctx(root, "queue", "claim", *P, "--worker", "builder-7", "--pid", str(holder.pid))
        assert claimed.returncode == 0, claimed.stderr
        lease = json.loads((qdir(root) / "lease" / "w.req.json" / "worker").read_text())

        assert ctx(root, "queue", "finish", *P, "w", "--ok").returncode == 0
    finally:
        holder.kill()
        holder.wait()
    stored = json.loads((qdir(root) / "done" / "w.req.json.result").read_text())
    assert stored["worker"]["id"] == "builder-7" and stored["worker"]["pid"] == holder.pid
    assert stored["started"] == lease["claimed_at"]


def test_finishing_a_claim_without_a_lease_is_refused(root: Path, req: Path) -> None:
    """claimed/J/J without lease/J/worker never ran (Q-3): finish refuses it (ENOENT) and
    changes nothing, and recover --reconcile returns it to pending (Q-6)."""
    claim_dir = qdir(root) / "claimed" / "nl.req.json"
    claim_dir.mkdir()
    (claim_dir / "nl.req.json").write_bytes(req.read_bytes())

    refused = ctx(root, "queue", "finish", *P, "nl", "--ok")

    assert refused.returncode == 1 and "ctx: ENOENT: " in refused.stderr
    assert "never ran" in refused.stderr
    assert os.listdir(qdir(root) / "done") == [] and (claim_dir / "nl.req.json").is_file()
    assert ctx(root, "queue", "recover", *P, "--reconcile").returncode == 0
    assert os.listdir(qdir(root) / "pending") == ["nl.req.json"]


NOT_JSON_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]


def refused_alone_and_in_a_batch(
    root: Path, value: str
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Publish a request whose input holds ``value`` (JSON text) alone, then as the second
    line of a batch: both refused (exit 1, nothing printed), nothing stored."""
    body = '{"tool":"fs.list","input":{"n":' + value + "}}"
    good = json.dumps(request(1))
    single = ctx(root, "queue", "publish", *P, "-", stdin=body)
    batch = ctx(root, "queue", "publish", *P, "--batch", "-", stdin=f"{good}\n{body}\n")
    for done in (single, batch):
        assert done.returncode == 1 and done.stdout == "", done
        assert "Traceback" not in done.stderr, done.stderr
    assert os.listdir(qdir(root) / "pending") == [] and os.listdir(qdir(root) / "inbox") == []
    return single, batch


@pytest.mark.parametrize("number", NOT_JSON_NUMBERS)
def test_a_request_holding_nan_or_infinity_is_refused(root: Path, number: str) -> None:
    """§2.1: a request is one JSON object, and JSON has no NaN or infinities (Python's reader
    takes them): publish and publish --batch refuse them with EINVAL and store nothing."""
    single, batch = refused_alone_and_in_a_batch(root, number)
    for done in (single, batch):
        assert "EINVAL" in done.stderr and number in done.stderr, done.stderr
    assert "line 2" in batch.stderr


@pytest.mark.parametrize("number", NOT_JSON_NUMBERS)
def test_a_result_file_holding_nan_or_infinity_is_refused(
    root: Path, req: Path, tmp_path: Path, number: str
) -> None:
    """§2.1: a result file that parses as JSON only by Python's leave (NaN, ±Infinity) would
    make a result that is no JSON: EINVAL, and the job stays claimed."""
    ctx(root, "queue", "publish", *P, "--name", "nan", str(req))
    ctx(root, "queue", "claim", *P)
    result = tmp_path / "result.json"
    result.write_text('{"ratio": ' + number + "}")
    done = ctx(root, "queue", "finish", *P, "nan", "--ok", str(result))
    assert done.returncode == 1 and "EINVAL" in done.stderr and number in done.stderr, done
    assert os.listdir(qdir(root) / "done") == []
    assert os.listdir(qdir(root) / "claimed") == ["nan.req.json"]
    text = ctx(root, "queue", "finish", *P, "nan", "--ok", "-", stdin=f"ratio: {number}\n")
    assert text.returncode == 0, text.stderr  # not JSON at all: kept as text, as ever


UNREADABLE_JSON = {
    "nested 100 000 deep": "[" * 100_000 + "]" * 100_000,
    "nested 129 deep": "[" * 129 + "]" * 129,
    "an integer of 5 000 digits": "9" * 5_000,
}


@pytest.mark.parametrize("value", UNREADABLE_JSON.values(), ids=UNREADABLE_JSON.keys())
def test_a_request_no_reader_can_take_is_refused_as_not_json(root: Path, value: str) -> None:
    """Well under the size limit, but Python's reader (or the next one) fails on it: EINVAL,
    exit 1, nothing stored, never a traceback."""
    for done in refused_alone_and_in_a_batch(root, value):
        assert done.stderr.startswith("ctx: EINVAL: ") and "not JSON" in done.stderr, done.stderr


def test_a_planted_request_no_reader_can_take_is_claimed_and_failed(root: Path, req: Path) -> None:
    """One put in pending/ by hand: claimed like any malformed request (never stranded half
    claimed), finished in failed/ by a worker, which goes on to the next job."""
    planted = qdir(root) / "pending" / "deep.req.json"
    planted.write_text("[" * 100_000 + "]" * 100_000)
    os.utime(planted, (1, 1))  # the oldest job: claimed first
    ctx(root, "queue", "publish", *P, "--name", "after", str(req))

    shown = ctx(root, "queue", "show", *P, "deep", "--json")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "nested deeper than" in shown.stdout
    claimed = ctx(root, "queue", "claim", *P, "--json", "--pid", str(dead_pid()))
    assert claimed.returncode == 0, claimed.stderr
    assert "nested deeper than" in json.loads(claimed.stdout)["request"]["invalid"]
    assert claimed.stderr.startswith("ctx: note: the request of deep.req.json is not valid (")
    assert "finish it with --error" in claimed.stderr, claimed.stderr
    assert os.listdir(qdir(root) / "lease") == ["deep.req.json"]
    assert ctx(root, "queue", "recover", *P).returncode == 0  # its holder is gone: requeued

    worked = ctx(root, "queue", "work", *P, "--drain", "--json")
    assert worked.returncode == 0 and "Traceback" not in worked.stderr, worked.stderr
    finished = [json.loads(line) for line in worked.stdout.splitlines()]
    assert [e["job"] for e in finished if e["event"] == "finish"] == [
        "deep.req.json",
        "after.req.json",
    ]
    assert sorted(os.listdir(qdir(root) / "failed")) == [
        "after.req.json",
        "after.req.json.result",
        "deep.req.json",
        "deep.req.json.result",
    ]
    assert os.listdir(qdir(root) / "pending") == [] and os.listdir(qdir(root) / "claimed") == []


@pytest.mark.parametrize("planted", ["symlink", "fifo", "garbage"])
def test_finishing_a_claim_whose_lease_is_no_lease_is_refused(
    root: Path, req: Path, tmp_path: Path, planted: str
) -> None:
    """What is not a lease (Q-8) beside a claim is a conflict that status reports; finish
    refuses it and changes nothing (Q-6), rather than removing it with the claim."""
    claim_dir = qdir(root) / "claimed" / "ls.req.json"
    claim_dir.mkdir()
    (claim_dir / "ls.req.json").write_bytes(req.read_bytes())
    lease_dir = qdir(root) / "lease" / "ls.req.json"
    lease_dir.mkdir()
    lease = lease_dir / "worker"
    if planted == "symlink":
        (tmp_path / "elsewhere").write_text("{}")
        lease.symlink_to(tmp_path / "elsewhere")
    elif planted == "fifo":
        os.mkfifo(lease)
    else:
        lease.write_text("garbage\n")
    before = sorted(str(p) for p in qdir(root).rglob("*"))

    status = ctx(root, "queue", "status", *P)
    refused = ctx(root, "queue", "finish", *P, "ls", "--ok")

    assert status.returncode == 1, status
    assert refused.returncode == 1 and refused.stderr.startswith("ctx: E"), refused
    assert "is not a lease" in refused.stderr and "nothing was changed" in refused.stderr
    assert sorted(str(p) for p in qdir(root).rglob("*")) == before
    assert os.path.lexists(lease) and os.listdir(qdir(root) / "done") == []


def test_finish_error_with_text_on_stdin(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "e", str(req))
    ctx(root, "queue", "claim", *P)
    done = ctx(root, "queue", "finish", *P, "e.req.json", "--error", "-", stdin="it broke\n")
    assert done.returncode == 0
    stored = json.loads((qdir(root) / "failed" / "e.req.json.result").read_text())
    assert stored["status"] == "error" and stored["output"] == "it broke\n"


def test_finish_takes_a_whole_result_object_too(root: Path, req: Path, tmp_path: Path) -> None:
    """SPEC §2.1's result shape as RESULT_FILE: its output is taken, its status must agree."""
    for name in ("w", "x"):
        ctx(root, "queue", "publish", *P, "--name", name, str(req))
    ctx(root, "queue", "claim", *P)
    whole = write_json(tmp_path / "whole.json", {"status": "ok", "output": {"lines": 3}})

    done = ctx(root, "queue", "finish", *P, "w", "--ok", str(whole))
    ctx(root, "queue", "claim", *P)
    disagrees = ctx(root, "queue", "finish", *P, "x", "--error", str(whole))

    assert done.returncode == 0, done.stderr
    stored = json.loads((qdir(root) / "done" / "w.req.json.result").read_text())
    assert stored["status"] == "ok" and stored["output"] == {"lines": 3}
    assert disagrees.returncode == 2 and "says status 'ok'" in disagrees.stderr
    assert (qdir(root) / "claimed" / "x.req.json" / "x.req.json").exists(), "still claimed"


def test_finish_needs_an_outcome_and_a_claim(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "n", str(req))
    assert ctx(root, "queue", "finish", *P, "n").returncode == 2
    done = ctx(root, "queue", "finish", *P, "n", "--ok")
    assert done.returncode == 1 and "ENOENT" in done.stderr


def test_status_json_gives_each_count_at_the_top_level_and_in_counts(root: Path, req: Path) -> None:
    """SPEC §2.4 says "counts per state": a reader takes them from the object itself
    (``["pending"]``) or from ``counts``; ``incomplete`` and ``ignored`` stay the lists."""
    for name in ("a", "b", "c"):
        ctx(root, "queue", "publish", *P, "--name", name, str(req))
    ctx(root, "queue", "claim", *P, "--pid", str(os.getpid()))
    (qdir(root) / "pending" / ".dot").write_text("x")
    status = json.loads(ctx(root, "queue", "status", *P, "--json").stdout)
    counts = {"pending": 2, "claimed": 1, "done": 0, "failed": 0, "conflict": 0}
    assert {state: status[state] for state in counts} == counts
    assert status["counts"] == {**counts, "incomplete": 0, "ignored": 1}
    assert status["incomplete"] == [] and status["ignored"][0]["reason"] == "dot-file"
    assert list(status)[:7] == ["queue", *counts, "counts"]


def test_status_says_that_a_missing_config_leaves_every_limit_at_its_default(
    root: Path, req: Path
) -> None:
    """A queue whose config was removed works with the default limits: status says so, as
    a lowered max_request_bytes would otherwise pass for still set; the JSON is unchanged."""
    ctx(root, "queue", "publish", *P, "--name", "a", str(req))
    quiet = ctx(root, "queue", "status", *P)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    (qdir(root) / "config").unlink()
    for options in ((), ("--json",)):
        status = ctx(root, "queue", "status", *P, *options)
        assert status.returncode == 0, status.stderr
        assert status.stderr.startswith(f"ctx: note: {qdir(root) / 'config'} is missing"), status
        assert "'ctx queue init" in status.stderr
    assert json.loads(status.stdout)["pending"] == 1


def test_status_list_and_show(root: Path, req: Path) -> None:
    for name in ("a", "b", "c"):
        ctx(root, "queue", "publish", *P, "--name", name, str(req))
    ctx(root, "queue", "claim", *P)
    (qdir(root) / "pending" / ".dot").write_text("x")
    status = json.loads(ctx(root, "queue", "status", *P, "--json").stdout)
    assert status["counts"]["pending"] == 2 and status["counts"]["claimed"] == 1
    assert status["counts"]["ignored"] == 1 and status["ignored"][0]["reason"] == "dot-file"
    text = ctx(root, "queue", "status", *P).stdout
    assert "pending" in text and "ignored" in text and "pending/.dot" in text
    listed = ctx(root, "queue", "list", *P, "--state", "pending").stdout.split()
    assert len(listed) == 2 and all(n.endswith(".req.json") for n in listed)
    every = json.loads(ctx(root, "queue", "list", *P, "--json").stdout)
    assert sorted(j["state"] for j in every) == ["claimed", "pending", "pending"]
    claimed = next(j["name"] for j in every if j["state"] == "claimed")
    shown = json.loads(ctx(root, "queue", "show", *P, claimed, "--json").stdout)
    assert shown["state"] == "claimed" and shown["request"]["input"] == {"n": 1}
    assert {e["path"] for e in shown["evidence"]} >= {
        f"claimed/{claimed}/{claimed}",
        f"lease/{claimed}/worker",
    }
    assert shown["lease"]["job"] == claimed
    # The claim's holder is the ctx process's parent, this test's process: alive.
    assert shown["holder"] == {
        "state": "alive",
        "reason": f"pid {os.getpid()} on {HOST} is running",
    }
    assert ctx(root, "queue", "show", *P, "ghost").returncode == 1
    pending = json.loads(ctx(root, "queue", "show", *P, listed[0], "--json").stdout)
    assert "holder" not in pending and "lease" not in pending


def test_show_says_a_holder_whose_lease_expired_is_gone(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "a", str(req))
    assert ctx(root, "queue", "claim", *P, "--ttl", "1").returncode == 0
    time.sleep(1.2)

    text = ctx(root, "queue", "show", *P, "a").stdout.splitlines()
    shown = json.loads(ctx(root, "queue", "show", *P, "a", "--json").stdout)

    assert shown["holder"]["state"] == "gone"
    assert shown["holder"]["reason"].startswith(f"lease of pid {os.getpid()} on {HOST} expired at")
    assert text[-1] == f"holder: gone ({shown['holder']['reason']})"


def test_show_prints_a_request_holding_a_lone_surrogate_escaped(root: Path) -> None:
    """JSON can spell "\\ud800"; publish keeps it as it came, and show prints it so."""
    spelled = '{"tool": "fs.stat", "input": {"path": "\\ud800"}}'
    ctx(root, "queue", "publish", *P, "--name", "odd", "-", stdin=spelled)

    text = ctx(root, "queue", "show", *P, "odd")
    as_json = ctx(root, "queue", "show", *P, "odd", "--json")

    assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
    assert '"input": {"path": "\\ud800"}' in text.stdout
    assert json.loads(as_json.stdout)["request"]["input"] == {"path": "\ud800"}


def test_recover_exit_statuses_and_json(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "x", str(req))
    ctx(root, "queue", "claim", *P, "--pid", str(os.getpid()))
    lease = qdir(root) / "lease" / "x.req.json" / "worker"
    held = json.loads(lease.read_text())
    lease.write_text(json.dumps({**held, "pid": dead_pid()}))
    dry = ctx(root, "queue", "recover", *P, "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["requeued"][0]["job"] == "x.req.json"
    assert (qdir(root) / "claimed" / "x.req.json").exists()
    done = ctx(root, "queue", "recover", *P)
    assert done.returncode == 0 and "requeue" in done.stdout
    assert (qdir(root) / "pending" / "x.req.json").exists()
    os.mkdir(qdir(root) / "claimed" / "y.req.json")
    (qdir(root) / "claimed" / "y.req.json" / "y.req.json").write_text(json.dumps(request()))
    assert ctx(root, "queue", "recover", *P).returncode == 1
    fixed = ctx(root, "queue", "recover", *P, "--reconcile", "--grace", "0", "--json")
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["consistent"]


def test_a_conflict_found_is_exit_status_1(root: Path, req: Path) -> None:
    ctx(root, "queue", "publish", *P, "--name", "x", str(req))
    assert ctx(root, "queue", "status", *P).returncode == 0
    name = ctx(root, "queue", "claim", *P).stdout.strip()
    assert ctx(root, "queue", "finish", *P, name, "--ok", stdin="1").returncode == 0
    (qdir(root) / "pending" / name).write_text(json.dumps(request(1)))  # J pending and done

    status = ctx(root, "queue", "status", *P)
    status_json = ctx(root, "queue", "status", *P, "--json")
    show = ctx(root, "queue", "show", *P, "x")
    listed = ctx(root, "queue", "list", *P, "--json")
    done = ctx(root, "queue", "list", *P, "--state", "done")

    assert status.returncode == 1 and "conflict" in status.stdout
    assert status_json.returncode == 1 and json.loads(status_json.stdout)["conflicts"]
    assert show.returncode == 1 and "conflict" in show.stdout
    assert listed.returncode == 1 and json.loads(listed.stdout)[0]["state"] == "conflict"
    assert (done.returncode, done.stdout) == (0, "")  # no conflict among what it lists
    assert ctx(root, "queue", "claim", *P).returncode == 3  # never run a second time


def test_status_show_and_list_agree_on_what_is_not_a_job(root: Path, req: Path) -> None:
    """Q-8: a name whose only entries are symlinks is ignored by every command alike; a real
    job with a symlink among its evidence is a conflict."""
    (qdir(root) / "pending" / "lone.req.json").symlink_to("/etc/passwd")
    ctx(root, "queue", "publish", *P, "--name", "real", str(req))
    ctx(root, "queue", "claim", *P)
    worker = qdir(root) / "lease" / "real.req.json" / "worker"
    worker.unlink()
    worker.symlink_to("/etc/passwd")

    status = json.loads(ctx(root, "queue", "status", *P, "--json").stdout)
    lone = ctx(root, "queue", "show", *P, "lone")
    listed = json.loads(ctx(root, "queue", "list", *P, "--json").stdout)

    assert {i["path"] for i in status["ignored"]} == {
        "pending/lone.req.json",
        "lease/real.req.json/worker",
    }
    assert [c["job"] for c in status["conflicts"]] == ["real.req.json"]
    assert lone.returncode == 0 and "state:  ignored (not a job" in lone.stdout
    assert listed == [{"name": "real.req.json", "state": "conflict"}]


def test_a_dead_publishers_staging_file_holds_its_name_until_reconciled(
    root: Path, req: Path
) -> None:
    (qdir(root) / "inbox" / "x.req.json.publish.tmp").write_text('{"tool": "t", "inp')

    blocked = ctx(root, "queue", "publish", *P, "--name", "x", str(req))
    other = ctx(root, "queue", "publish", *P, "--name", "y", str(req))
    reconciled = ctx(root, "queue", "recover", *P, "--reconcile", "--grace", "0")
    again = ctx(root, "queue", "publish", *P, "--name", "x", str(req))

    assert blocked.returncode == 1 and "being published by another process" in blocked.stderr
    assert "recover --reconcile" in blocked.stderr
    assert other.returncode == 0  # only the name is held, not the queue
    assert reconciled.returncode == 0 and "inbox/x.req.json.publish.tmp" in reconciled.stdout
    assert (again.returncode, again.stdout) == (0, "x.req.json\n")


def test_storage_and_queue_options(tmp_path: Path, req: Path) -> None:
    root = tmp_path / "opt"
    root.mkdir()
    assert ctx(tmp_path / "ignored", "--storage", str(root), "queue", "init", *P).returncode == 0
    assert ctx(tmp_path / "ignored", "queue", "status", "--storage", str(root), *P).returncode == 0
    done = ctx(tmp_path / "ignored", "queue", "publish", "--queue", str(qdir(root)), str(req))
    assert done.returncode == 0 and (qdir(root) / "pending" / done.stdout.strip()).exists()


def test_project_takes_a_queue_path(tmp_path: Path, root: Path, req: Path) -> None:
    """SPEC §2.4: "--project NAME (or a queue path)"; an existing queue's path is a path."""
    elsewhere = tmp_path / "elsewhere"  # CTX_STORAGE points at a root without the queue
    path = str(qdir(root))
    published = ctx(elsewhere, "queue", "publish", "--project", path, "--name", "q", str(req))
    status = ctx(elsewhere, "queue", "status", "--project", path, "--json")
    claimed = ctx(elsewhere, "queue", "claim", "--project", path)
    relative = subprocess.run(
        [sys.executable, "-m", "cortexfs", "queue", "list", "--project", "./queue"],
        capture_output=True,
        text=True,
        cwd=qdir(root).parent,
        env={**os.environ, "CTX_STORAGE": str(elsewhere)},
    )

    assert (published.returncode, published.stdout) == (0, "q.req.json\n")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["pending"] == 1
    assert (claimed.returncode, claimed.stdout) == (0, "q.req.json\n")
    assert (relative.returncode, relative.stdout) == (0, "claimed    q.req.json\n")
    assert not elsewhere.exists()


@pytest.mark.parametrize("project", ["../escape", "a/b", "nowhere/queue"])
def test_a_project_with_a_slash_that_is_no_queue_is_an_illegal_name(
    tmp_path: Path, root: Path, project: str
) -> None:
    before = set(tmp_path.rglob("*"))

    refused = subprocess.run(
        [sys.executable, "-m", "cortexfs", "queue", "init", "--project", project],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "CTX_STORAGE": str(root)},
    )

    assert refused.returncode == 2 and "EINVAL" in refused.stderr
    assert set(tmp_path.rglob("*")) == before, "nothing was created"


def test_an_uninitialised_queue_is_explained(tmp_path: Path) -> None:
    done = ctx(tmp_path / "none", "queue", "status", *P)
    assert done.returncode == 1 and "ENOENT" in done.stderr and "ctx queue init" in done.stderr


def test_usage_errors_exit_2(root: Path) -> None:
    assert ctx(root, "queue", "claim", *P, "--bogus").returncode == 2
    assert ctx(root, "queue", "status").returncode == 2  # no --project
    assert ctx(root, "queue", "list", *P, "--state", "lost").returncode == 2
    assert ctx(root, "queue", "claim", *P, "--ttl", "0").returncode == 2
    empty = ctx(root, "queue", "status", "--project", "")
    assert empty.returncode == 2 and "--project '' is empty" in empty.stderr, empty.stderr


@pytest.mark.parametrize("ttl", ["0", "-1", "nan", "inf", "1e12"])
def test_an_unusable_ttl_is_refused_before_anything_moves(root: Path, req: Path, ttl: str) -> None:
    """A lease lifetime must make an expires_at that is a date: checked before the claim
    move, so a refused claim never strands a job claimed without its lease."""
    job = ctx(root, "queue", "publish", *P, "--name", "t", str(req)).stdout.strip()
    before = sorted(p.relative_to(qdir(root)) for p in qdir(root).rglob("*"))

    claimed = ctx(root, "queue", "claim", *P, "--ttl", ttl)
    worked = ctx(root, "queue", "work", *P, "--drain", "--ttl", ttl)

    for done in (claimed, worked):
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[-1].startswith("ctx: EINVAL: ")
        assert "Traceback" not in done.stderr
    assert sorted(p.relative_to(qdir(root)) for p in qdir(root).rglob("*")) == before
    assert (qdir(root) / "pending" / job).exists()


@pytest.fixture
def root_bound_elsewhere(root: Path, tmp_path: Path):
    """The storage root under a second name: a bind mount of it (root only)."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    alias = tmp_path / "alias"
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(root), str(alias)], check=True)
    try:
        yield alias
    finally:
        subprocess.run(["umount", "-l", str(alias)], check=True)


def test_a_queue_path_through_a_bind_mount_of_the_root_is_judged_as_inside_it(
    root: Path, root_bound_elsewhere: Path
) -> None:
    """R-2: the same directory under another name is the root all the same: ALIAS/queue
    would make ROOT/queue, and is refused; ALIAS/shared/P/queue is P's queue."""
    alias = root_bound_elsewhere
    refused = ctx(root, "queue", "init", "--queue", str(alias / "queue"))
    assert refused.returncode == 2 and "is not a project's queue" in refused.stderr
    assert not (root / "queue").exists()
    made = ctx(root, "queue", "init", "--queue", str(alias / "shared" / "p" / "queue"))
    assert made.returncode == 0, made.stderr
    assert (root / "shared" / "p" / "queue" / "pending").is_dir()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--timeout", "1e10"), ("--timeout", "31622401"), ("--concurrency", "1025")],
)
def test_work_refuses_a_timeout_or_concurrency_it_could_not_keep(
    root: Path, req: Path, option: str, value: str
) -> None:
    """A timeout past what timed waits can hold would fail every job it ran into failed/ for
    good; tens of thousands of job slots exhaust threads before the jobs: both are usage
    errors."""
    ctx(root, "queue", "publish", *P, "--name", "kept", str(req))

    done = ctx(root, "queue", "work", *P, "--drain", option, value)

    assert done.returncode == 2 and "EINVAL" in done.stderr and option in done.stderr, done
    assert os.listdir(qdir(root) / "pending") == ["kept.req.json"]


def test_names_planted_in_the_queue_are_shown_escaped_in_text(root: Path) -> None:
    """Any member of the queue's group can name a file so that listing it retitles or clears
    the operator's terminal: text output shows such names escaped (JSON escapes them too)."""
    planted = "x\x1b]0;PWNED\x07.req.json"
    (qdir(root) / "pending" / planted).write_text("{}")

    status = ctx(root, "queue", "status", *P)
    recovered = ctx(root, "queue", "recover", *P)
    as_json = ctx(root, "queue", "status", *P, "--json")

    for done in (status, recovered):
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\x07" not in done.stdout, done.stdout
        assert "pending/x\\x1b]0;PWNED\\x07.req.json" in done.stdout
    assert planted in [e["path"].split("/")[-1] for e in json.loads(as_json.stdout)["ignored"]]


def test_an_error_quoting_a_control_character_shows_it_escaped(root: Path) -> None:
    done = ctx(root, "queue", "show", *P, "job\x1b[2J")

    assert done.returncode == 2 and "\x1b" not in done.stderr, done.stderr
    assert "job\\x1b[2J" in done.stderr


def test_every_command_has_help(root: Path) -> None:
    for command in ("init", "publish", "claim", "renew", "finish", "status", "list", "show",
                    "recover"):  # fmt: skip
        done = ctx(root, "queue", command, "--help")
        assert done.returncode == 0 and "--project" in done.stdout and "--json" in done.stdout


def test_a_closed_output_pipe_ends_the_command_quietly(root: Path, req: Path) -> None:
    """``ctx queue status | head -1``: the reader leaves; no error line, no traceback."""
    ctx(root, "queue", "publish", *P, str(req))
    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "cortexfs", "queue", "status", *P],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CTX_STORAGE": str(root)},
    )
    assert reader_gone.stdout is not None
    reader_gone.stdout.close()  # before the command writes anything: its first write fails
    _, stderr = reader_gone.communicate(timeout=60)
    assert stderr == b""
    assert reader_gone.returncode == 141  # 128 + SIGPIPE, as a shell reports it; 1 is a conflict


@pytest.mark.parametrize("as_json", [False, True])
def test_a_claim_whose_name_nobody_read_says_which_job_is_held(
    root: Path, req: Path, as_json: bool
) -> None:
    """``ctx queue claim | true``: the claim is made before its name is written, so a reader
    that left cannot undo it; the job is named on stderr with its holder, then exit 141."""
    job = ctx(root, "queue", "publish", *P, str(req)).stdout.strip()
    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "cortexfs", "queue", "claim", *P, *(["--json"] * as_json)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CTX_STORAGE": str(root)},
        text=True,
    )
    assert reader_gone.stdout is not None
    reader_gone.stdout.close()
    _, stderr = reader_gone.communicate(timeout=60)

    assert reader_gone.returncode == 141
    assert os.listdir(qdir(root) / "claimed") == [job]
    holder = json.loads((qdir(root) / "lease" / job / "worker").read_text())["pid"]
    assert stderr == (
        "ctx: note: the reader of standard output left before it read the job's name: job "
        f"{job} is claimed and leased to pid {holder} (finish it, or 'ctx queue recover "
        f"--project {PROJECT}' requeues it once pid {holder} is gone)\n"
    )


@pytest.mark.parametrize(
    ("option", "value"), [("--agent", "bad name"), ("--agent", "a/b"), ("--session", "../s")]
)
def test_work_with_a_malformed_name_is_a_usage_error(
    root: Path, req: Path, option: str, value: str
) -> None:
    """§2.4: a malformed option value is a usage error (exit 2, ``ctx: EINVAL: …``), found
    before the worker claims anything."""
    job = ctx(root, "queue", "publish", *P, str(req)).stdout.strip()
    args = ["--agent", "somebody"] if option == "--session" else []
    done = ctx(root, "queue", "work", *P, *args, option, value, "--drain")
    assert done.returncode == 2, done
    assert done.stderr.startswith("ctx: EINVAL: illegal ") and repr(value) in done.stderr
    assert done.stdout == "" and os.listdir(qdir(root) / "pending") == [job]


def test_an_absolute_project_path_is_a_queue_path(tmp_path: Path, root: Path, req: Path) -> None:
    """§2.4 "--project NAME (or a queue path)": init makes the queue at an absolute path, new
    or an empty directory, and every command then uses it; a path with no queue is ENOENT."""
    fresh, empty = tmp_path / "queues" / "fresh", tmp_path / "empty"
    (tmp_path / "queues").mkdir()
    empty.mkdir()

    made = [ctx(root, "queue", "init", "--project", str(path)) for path in (fresh, empty)]
    published = ctx(root, "queue", "publish", "--project", str(fresh), "--name", "a", str(req))
    claimed = ctx(root, "queue", "claim", "--project", str(fresh))
    missing = ctx(root, "queue", "status", "--project", str(tmp_path / "nowhere"))

    assert [done.returncode for done in made] == [0, 0], [done.stderr for done in made]
    assert all((path / "pending").is_dir() for path in (fresh, empty))
    assert (published.stdout, claimed.stdout) == ("a.req.json\n", "a.req.json\n")
    assert missing.returncode == 1 and "ENOENT" in missing.stderr
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("inside", ["queue", "tool/queue", ".", "home/q", "shared/p"])
@pytest.mark.parametrize("option", ["--project", "--queue"])
def test_a_queue_path_inside_the_root_must_be_a_projects_queue(
    root: Path, inside: str, option: str
) -> None:
    """R-2: the root holds only its six entries, so a queue path into the root anywhere but
    shared/NAME/queue is a usage error, and nothing is made."""
    before = sorted(str(path.relative_to(root)) for path in root.rglob("*"))
    path = root / inside

    refused = ctx(root, "queue", "init", option, str(path))

    assert refused.returncode == 2 and "ctx: EINVAL: " in refused.stderr
    assert "is not a project's queue" in refused.stderr
    assert sorted(str(path.relative_to(root)) for path in root.rglob("*")) == before
    by_path = ctx(root, "queue", "status", option, str(qdir(root)))
    assert by_path.returncode == 0, by_path.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [("--pid", str(2**22 + 1)), ("--worker", ""), ("--worker", " \t")],
)
def test_a_pid_no_process_can_have_or_an_empty_worker_id_is_a_usage_error(
    root: Path, req: Path, option: str, value: str
) -> None:
    assert ctx(root, "queue", "publish", *P, str(req)).returncode == 0

    refused = ctx(root, "queue", "claim", *P, option, value)

    assert refused.returncode == 2 and "ctx: EINVAL: " in refused.stderr
    assert len(os.listdir(root / "shared" / PROJECT / "queue" / "pending")) == 1
