"""End-to-end flows of a user giving CortexFS numbers at and past their limits (SPEC §2.1
``queue/config``, Q-3 and Q-5 lease fields, §2.4 ``--ttl``/``--grace``/``--timeout``/
``--max-jobs``/``--concurrency`` and exit statuses, A-3 ``ctx agent create`` ids, X-1
``ctx shared create --group``, P-8 ``ctx policy``, H-4 ``tool/tsh.d/config``, T-8 v2
manifests, S-1 ``ctx session tail -n``).

Every number goes in as a user types it: 0, -1, -0, 1, the largest accepted value and one
past it, 2**31, 2**63, 10**30, 1e309, inf, nan, 1.5 where an integer is expected, ``1_000``,
``+5``, ``0x10``, an Arabic-Indic digit, an empty string and an integer of thousands of
digits.  A value is either taken exactly as documented (never silently clamped) or refused
with ``EINVAL`` naming the option or the config line, the exit status of §2.4 (2 for a
usage error, 1 for a refused operation), no traceback, and nothing half-done: no job
claimed, no lease rewritten, no agent, space or file made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    SUFFIX,
    QueueCLI,
    clean_env,
    ctx_run,
    request,
    rfc3339,
    snapshot,
)

DAYS_366 = 366 * 24 * 3600  # the longest lease lifetime, grace and timeout (docs/queue.md)
MAX_ID = 2**32 - 2  # the largest uid or gid: (uid_t) -1 is "no id"
THOUSANDS_OF_DIGITS = "9" * 5000  # past the 4300 digits Python's int() reads from text

# Spellings no command reads as a number of seconds, whatever the option.
PYTHON_ERROR = re.compile(r"^\w+(Error|Exception): ", re.MULTILINE)
NOT_SECONDS = ["-0", "1e309", "nan", "", "0x10", str(2**63)]


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process that stands in as a lease holder; killed at teardown."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def no_traceback(run) -> None:
    """A refusal in ``ctx: ERRNO: …`` words, never a Python traceback."""
    assert "Traceback" not in run.err and not PYTHON_ERROR.search(run.err), run


def refused_as_usage(run, option: str) -> None:
    """§2.4: a usage error (exit 2), EINVAL naming the option; on stdout nothing, or with
    ``--json`` the error object alone."""
    assert run.rc == 2, run
    assert "EINVAL" in run.err and option in run.err, run
    assert run.out == "" or run.json()["error"] == "EINVAL", run
    no_traceback(run)


def lease_period(queue: QueueCLI, job: str) -> float:
    lease = queue.lease(job)
    start = lease.get("renewed_at") or lease["claimed_at"]
    return (rfc3339(lease["expires_at"]) - rfc3339(start)).total_seconds()


def set_config(queue: QueueCLI, line: str) -> str:
    """``line`` appended to the config init wrote; returns ``config:N`` of that line."""
    config = queue.dir / "config"
    text = config.read_text()
    config.write_text(text + line + "\n")
    return f"config:{len(text.splitlines()) + 1}"


def local_lease(pid: int, ttl: float = 600) -> dict:
    """A lease naming process ``pid`` on this host, boot and pid namespace, as Q-3 lists."""
    now = time.time()
    return {
        "worker": f"desk:{pid}",
        "host": os.uname().nodename,
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": pid,
        "claimed_at": now,
        "expires_at": now + ttl,
    }


def hand_claim(queue: QueueCLI, name: str, lease: dict) -> str:
    """J claimed and leased as §2.1 says, written straight to disk; returns J."""
    job = name + SUFFIX
    (queue.dir / "claimed" / job).mkdir()
    (queue.dir / "claimed" / job / job).write_text(json.dumps(request(tag=name)))
    (queue.dir / "lease" / job).mkdir()
    (queue.dir / "lease" / job / "worker").write_text(json.dumps(lease))
    return job


def agent_request(name: str) -> str:
    return json.dumps({"name": name, "label": f"{name}_t", "tools": ["fs.read"]})


def on(storage: Path, *args: str, input: str | bytes | None = None):
    return ctx_run(*args, input=input, env=clean_env(CTX_STORAGE=str(storage)))


# ------------------------------------------------------------- seconds on the command line


QUEUE_SECONDS = [
    ("claim", "--ttl"),
    ("renew", "--ttl"),
    ("recover", "--grace"),
    ("work", "--timeout"),
    ("work", "--ttl"),
]


@pytest.mark.parametrize(("command", "option"), QUEUE_SECONDS)
def test_queue_seconds_out_of_range_are_usage_errors_that_move_nothing(
    queue, holder, command, option
):
    """§2.4: ``claim --ttl``, ``renew --ttl``, ``recover --grace``, ``work --timeout`` and
    ``work --ttl`` of -0 (not ``--grace``), 1e309, nan, an empty string, 0x10 and 2**63
    are usage errors (exit 2, EINVAL naming the option) before any step: the
    pending job stays pending, the claimed one keeps its lease byte for byte, no temp is
    written and a worker claims nothing."""
    waiting = queue.publish(name="waiting")
    held = queue.claim("--pid", str(holder.pid))
    assert held == waiting and queue.state(held) == "claimed"
    queue.publish(name="second")
    before = snapshot(queue.dir)
    fixed = {
        "claim": ["--pid", str(holder.pid)],
        "renew": [held, "--pid", str(holder.pid)],
        "recover": ["--reconcile"],
        "work": ["--drain"],
    }[command]
    for value in NOT_SECONDS:
        if command == "recover" and value == "-0":
            continue  # a grace of 0 is documented (every stray temp is stale)
        refused = queue.run(command, *fixed, option, value)
        refused_as_usage(refused, option)
        assert snapshot(queue.dir) == before, (option, value)


# How Python's int() and float() read numbers that a person does not write: digits of
# another script, an underscore, a plus sign, blanks around.  Every option refuses them, as
# the queue's config file does.
ODD_SPELLINGS = ["\u0663", "1_000", "+5", " 5 "]


def test_numbers_on_the_command_line_are_read_as_people_write_them(queue, holder, storage):
    """§2.4, the queue's config (docs/queue.md): a number another script's digits, an
    underscore, a plus sign or blanks spell is a usage error (exit 2, EINVAL naming the
    option) for every option that takes one, as ``lease_ttl`` and ``grace`` refuse them in
    ``queue/config``: ``--ttl`` of claim, renew and work, ``--grace``, ``--timeout`` of work
    and ``ctx run``, ``--max-jobs``, ``--concurrency``, ``claim --pid``, ``session tail
    -n``, ``--uid``; nothing moves."""
    held = queue.publish(name="held")
    assert queue.claim("--pid", str(holder.pid)) == held
    queue.publish(name="waits")
    before = snapshot(queue.dir)
    pid = ["--pid", str(holder.pid)]
    queue_options = [
        ("claim", [*pid], "--ttl"),
        ("claim", [], "--pid"),
        ("renew", [held, *pid], "--ttl"),
        ("recover", ["--reconcile"], "--grace"),
        ("work", ["--drain"], "--timeout"),
        ("work", ["--drain"], "--ttl"),
        ("work", ["--drain"], "--max-jobs"),
        ("work", ["--drain"], "--concurrency"),
    ]
    for value in ODD_SPELLINGS:
        for command, fixed, option in queue_options:
            refused_as_usage(queue.run(command, *fixed, option, value), option)
            assert snapshot(queue.dir) == before, (command, option, value)
        for option in ("-n", "--uid"):
            tail = on(storage, "session", "tail", "a", option, value)
            refused_as_usage(tail, option)
        ran = on(storage, "run", "--agent", "nobody-here", "--timeout", value, "fs.read")
        refused_as_usage(ran, "--timeout")


def test_run_timeout_out_of_range_is_a_usage_error_naming_it(storage):
    """§2.4 / T-3: ``ctx run --timeout`` of -0, 1e309, nan, an empty string, 0x10, 2**63
    and 366 days plus a second is refused (exit 2, EINVAL naming
    ``--timeout``) before any tool is looked for."""
    for value in [*NOT_SECONDS, str(DAYS_366 + 1)]:
        refused = on(storage, "run", "--agent", "nobody-here", "--timeout", value, "fs.read")
        refused_as_usage(refused, "--timeout")


def test_lease_lifetimes_in_range_are_taken_exactly_never_clamped(queue, holder):
    """§2.4 ``--ttl``: 1 and 1.5 seconds (a fraction where whole seconds are common) and
    366 days are each the lease's exact lifetime; ``renew --ttl 2.5`` makes it exactly 2.5."""
    jobs = [queue.publish(name=f"j{n}") for n in range(3)]
    for job, ttl in zip(jobs, ("1", "1.5", str(DAYS_366)), strict=True):
        took = queue.run("claim", "--pid", str(holder.pid), "--ttl", ttl)
        assert took.rc == 0 and took.out.strip() == job, took
        assert lease_period(queue, job) == pytest.approx(float(ttl), abs=1e-3), (job, ttl)
    renewed = queue.run("renew", jobs[2], "--pid", str(holder.pid), "--ttl", "2.5")
    assert renewed.rc == 0, renewed
    assert lease_period(queue, jobs[2]) == pytest.approx(2.5, abs=1e-3)


@pytest.mark.parametrize(
    ("option", "bad", "good"),
    [
        ("--max-jobs", ["0", "1.5", "1e30", ""], [str(2**63)]),
        ("--concurrency", ["0", "1025", str(2**63), ""], []),
    ],
)
def test_worker_counts_at_their_limits(queue, option, bad, good):
    """§2.4 ``work --max-jobs N`` (at least 1) and ``--concurrency N`` (1 to 1024): below,
    above, fractional, float-spelled or empty values are usage errors that claim nothing;
    ``--max-jobs`` of 2**63 is simply a bound never reached (the drain ends when the queue is
    empty, exit 0)."""
    queue.publish(name="stay")
    before = snapshot(queue.dir)
    for value in bad:
        refused_as_usage(queue.run("work", "--drain", option, value), option)
        assert snapshot(queue.dir) == before, value
    (queue.dir / "pending" / f"stay{SUFFIX}").unlink()
    for value in good:
        drained = queue.run("work", "--drain", option, value)
        assert drained.rc == 0, drained
        no_traceback(drained)


# ---------------------------------------------------------------------------- queue/config


def test_config_byte_limits_far_past_any_file_are_taken_and_malformed_ones_name_the_line(
    queue, holder
):
    """§2.1 (``max_request_bytes``, ``max_result_bytes`` in ``queue/config``): 2**63 and
    10**30 are limits no request reaches, so a 2 MB request publishes, is claimed and
    finishes with a 2 MB result; ``1_000``, ``+5``, ``0x10``, an Arabic-Indic digit and
    an empty value refuse every command with ``EINVAL`` naming ``config:LINE``
    (exit 1), and nothing is published."""
    config = queue.dir / "config"
    written = config.read_text()
    big = {"tool": "fs.read", "input": {"pad": "x" * 2_000_000}}
    for limit in (2**63, 10**30):
        config.write_text(written + f"max_request_bytes={limit}\nmax_result_bytes={limit}\n")
        published = queue.run("publish", "-", input=json.dumps(big))
        assert published.rc == 0, (limit, published)
        job = published.out.strip()
        assert queue.claim("--pid", str(holder.pid)) == job
        finished = queue.run("finish", job, "--ok", "-", input=json.dumps({"y": "z" * 2_000_000}))
        assert finished.rc == 0, (limit, finished)
        assert queue.only_result(job)[0] == "done"
    for value in ("1_000", "+5", "0x10", "\u0663", ""):
        config.write_text(written)
        where = set_config(queue, f"max_request_bytes={value}")
        before = snapshot(queue.dir)
        refused = queue.run("publish", "-", input=json.dumps(request()))
        assert refused.rc == 1 and refused.out == "", (value, refused)
        assert refused.err.startswith("ctx: EINVAL: ") and where in refused.err, (value, refused)
        assert "max_request_bytes" in refused.err, refused
        no_traceback(refused)
        assert snapshot(queue.dir) == before


def test_a_config_byte_limit_of_thousands_of_digits_is_einval_naming_its_line(queue):
    """§2.1, §2.4: ``max_request_bytes`` written as 5000 nines (a key held down, a paste gone
    wrong) is as malformed as ``1.5``: ``status``, ``publish`` and ``recover`` each refuse
    with ``EINVAL`` naming ``config:LINE`` (exit 1), no traceback, nothing published."""
    job = queue.publish(name="before")
    where = set_config(queue, f"max_request_bytes={THOUSANDS_OF_DIGITS}")
    before = snapshot(queue.dir)
    for argv, given in ((("status",), None), (("publish", "-"), request()), (("recover",), None)):
        refused = queue.run(*argv, input=None if given is None else json.dumps(given))
        no_traceback(refused)
        assert refused.rc == 1 and refused.err.startswith("ctx: EINVAL: "), refused
        assert where in refused.err, refused
    assert snapshot(queue.dir) == before
    assert queue.state(job) == "pending"


# ------------------------------------------------------------------ hand-edited lease numbers


def test_lease_numbers_outside_any_process_are_judged_or_conflicts_and_recover_goes_on(
    queue, holder
):
    """Q-5, Q-6: leases hand-edited with a pid namespace of -1, 2**63 or a 400-digit integer
    name another namespace (the holder is beyond sight, the job kept); a pid of 0 or 2**63
    makes the lease unreadable (a conflict, left alone).  ``status`` and ``show`` answer
    without a traceback, and ``recover`` still requeues the job whose lease plainly expired
    and leaves every other claimed, lease byte for byte."""
    base = local_lease(holder.pid)
    odd = {
        "ns-minus-one": {**base, "pid_ns": -1},
        "ns-2-63": {**base, "pid_ns": 2**63},
        "ns-400-digits": {**base, "pid_ns": 10**400},
        "pid-zero": {**base, "pid": 0},
        "pid-2-63": {**base, "pid": 2**63},
    }
    jobs = {name: hand_claim(queue, name, lease) for name, lease in odd.items()}
    expired = hand_claim(queue, "expired", {**base, "expires_at": time.time() - 60})
    leases = {job: (queue.dir / "lease" / job / "worker").read_bytes() for job in jobs.values()}

    status = queue.run("status", "--json")
    no_traceback(status)
    conflicts = json.dumps(status.json()["conflicts"])
    for name in ("pid-zero", "pid-2-63"):
        assert jobs[name] in conflicts, (name, status)
    for job in jobs.values():
        shown = queue.run("show", job, "--json")
        no_traceback(shown)
        assert shown.rc in (0, 1) and shown.json()["name"] == job, shown
    recovered = queue.run("recover", "--json")
    no_traceback(recovered)
    assert recovered.rc == 1, recovered  # the unreadable leases stay conflicts
    assert expired in json.dumps(recovered.json()["requeued"]), recovered
    assert queue.state(expired) == "pending"
    for job, data in leases.items():
        assert queue.state(job) == "claimed", job
        assert (queue.dir / "lease" / job / "worker").read_bytes() == data


def test_a_lease_pid_namespace_of_thousands_of_digits_is_a_conflict_and_recover_goes_on(
    queue, holder
):
    """Q-5, Q-6: ``pid_ns`` may be written as readlink shows it, ``pid:[N]``.  One whose N
    has 5000 digits names no namespace of this host: the lease is judged (another
    namespace) or unreadable (a conflict), never a traceback; ``recover`` still requeues the
    job beside it whose lease plainly expired."""
    base = local_lease(holder.pid)
    odd = hand_claim(queue, "odd", {**base, "pid_ns": f"pid:[{THOUSANDS_OF_DIGITS}]"})
    expired = hand_claim(queue, "expired", {**base, "expires_at": time.time() - 60})
    kept = (queue.dir / "lease" / odd / "worker").read_bytes()
    for argv in (("status",), ("show", odd), ("renew", odd, "--pid", str(holder.pid))):
        ran = queue.run(*argv)
        no_traceback(ran)
        assert ran.rc in (0, 1), ran
    recovered = queue.run("recover")
    no_traceback(recovered)
    assert queue.state(expired) == "pending", recovered
    assert queue.state(odd) == "claimed"
    assert (queue.dir / "lease" / odd / "worker").read_bytes() == kept


# ------------------------------------------------------------------------ ids of users, groups


def test_agent_ids_at_their_limits(storage):
    """A-3, ``ctx agent create --gid`` (ids 0 to 2**32-2): 2**32-2 and 2**31 are taken as
    given; 2**32-1 and -1 are refused (exit 2, EINVAL naming ``--gid``); ``--user`` of
    2**32-1 and ``--groups`` of 1.5, ``1_000`` or an Arabic-Indic digit likewise.  A
    refused create leaves no agent entry and no control directory."""
    for n, gid in enumerate((MAX_ID, 2**31)):
        made = on(storage, "agent", "create", "-", "--gid", str(gid), "--json",
                  input=agent_request(f"ok{n}"))  # fmt: skip
        assert made.rc == 0, made
        assert made.json()["identity"]["gid"] == gid, made
    refusals = [("--gid", str(MAX_ID + 1)), ("--gid", "-1"), ("--user", str(MAX_ID + 1))]
    refusals += [("--groups", v) for v in ("1.5", "1_000", "\u0663")]
    for n, (option, value) in enumerate(refusals):
        name = f"no{n}"
        refused = on(storage, "agent", "create", "-", option, value, input=agent_request(name))
        refused_as_usage(refused, option)
        assert not (storage / "agent" / name).exists(), refused
        assert not (storage / "agent" / f"{name}.d").exists(), refused


def test_a_gid_is_read_as_groups_are_read(storage):
    """A-3: ``--gid`` and ``--groups`` take the same thing, ids written in decimal.  A
    spelling ``--groups`` refuses as no id (an Arabic-Indic digit, ``1_000``, ``+5``,
    `` 5 ``) is refused by ``--gid`` too (exit 2, EINVAL naming ``--gid``), rather than
    quietly making an agent of group 3, 1000 or 5."""
    for n, value in enumerate(("\u0663", "1_000", "+5", " 5 ")):
        name = f"sp{n}"
        as_groups = on(storage, "agent", "create", "-", "--groups", value,
                       input=agent_request(name))  # fmt: skip
        refused_as_usage(as_groups, "--groups")
        as_gid = on(storage, "agent", "create", "-", "--gid", value, input=agent_request(name))
        assert not (storage / "agent" / name).exists(), (value, as_gid)
        refused_as_usage(as_gid, "--gid")


@pytest.mark.parametrize("option", ["--user", "--groups"])
def test_an_id_of_thousands_of_digits_is_a_usage_error(storage, option):
    """A-3: an id of 5000 digits is past 2**32-2 as surely as 2**32-1 is: EINVAL naming the
    option, exit 2, no traceback, no agent."""
    refused = on(storage, "agent", "create", "-", option, THOUSANDS_OF_DIGITS,
                 input=agent_request("huge"))  # fmt: skip
    assert not (storage / "agent" / "huge").exists(), refused
    refused_as_usage(refused, option)


def test_space_groups_at_their_limits(storage):
    """X-1, ``ctx shared create --group``: gid 2**32-2 is taken; 2**32-1 is no
    group (EINVAL, exit 2), and -1, ``1_000`` or an Arabic-Indic digit no group name;
    a refused create makes no directory."""
    made = on(storage, "shared", "create", "top", "--group", str(MAX_ID))
    assert made.rc == 0, made
    assert (storage / "shared" / "top").stat().st_gid == MAX_ID
    for n, value in enumerate((str(MAX_ID + 1), "-1", "1_000", "\u0663")):
        refused = on(storage, "shared", "create", f"no{n}", "--group", value)
        assert refused.rc == 2 and "EINVAL" in refused.err, (value, refused)
        no_traceback(refused)
        assert not (storage / "shared" / f"no{n}").exists(), refused


def test_a_space_group_of_thousands_of_digits_is_a_usage_error(storage):
    """X-1: a gid of 5000 digits is no group id, as 2**32-1 is not: EINVAL, exit 2, no
    traceback, no space."""
    refused = on(storage, "shared", "create", "huge", "--group", THOUSANDS_OF_DIGITS)
    assert not (storage / "shared" / "huge").exists(), refused
    assert refused.rc == 2 and "EINVAL" in refused.err, refused
    no_traceback(refused)


def test_policy_peer_ids_at_their_limits(storage):
    """P-8, ``ctx policy explain --peer UID:GID``: 2**32-1 as uid or gid, an Arabic-Indic
    digit, ``1_000`` and an empty half are malformed (exit 2, EINVAL naming ``--peer``)."""
    for peer in (f"{MAX_ID + 1}:0", f"0:{MAX_ID + 1}", "\u0663:0", "1_000:0", ":0", "0:"):
        refused = on(storage, "policy", "explain", "--peer", peer, "a", "tool:fs.read", "execute")
        refused_as_usage(refused, "--peer")


def test_a_peer_uid_of_thousands_of_digits_is_a_usage_error(storage):
    """P-8: a malformed query is exit 2 with EINVAL; a uid of 5000 digits is past 2**32-2."""
    peer = f"{THOUSANDS_OF_DIGITS}:0"
    refused = on(storage, "policy", "explain", "--peer", peer, "a", "tool:fs.read", "execute")
    refused_as_usage(refused, "--peer")


# ------------------------------------------------------------- session, tsh and manifests


def test_session_tail_counts_at_their_limits(storage):
    """S-1, ``ctx session tail -n N`` (0 to 2**63-1): 0 prints nothing, 2**63-1 prints
    every event; 2**63, -1, an empty string and 5000 digits are usage errors
    (exit 2, EINVAL naming ``-n``)."""
    events = storage / "home" / "0" / "agent" / "a" / "session" / "default"
    events.mkdir(parents=True)
    stamps = [f"2026-06-22T12:00:0{n}Z" for n in range(3)]
    (events / "events.jsonl").write_text(
        "".join(
            json.dumps({"ts": ts, "type": "note", "agent": "a", "session": "default"}) + "\n"
            for ts in stamps
        )
    )
    base = ("session", "tail", "a", "--uid", "0", "--json")
    none = on(storage, *base, "-n", "0")
    assert none.rc == 0 and none.out == "", none
    every = on(storage, *base, "-n", str(2**63 - 1))
    assert every.rc == 0, every
    assert [json.loads(line)["ts"] for line in every.lines()] == stamps
    for value in (str(2**63), "-1", "", THOUSANDS_OF_DIGITS):
        refused_as_usage(on(storage, *base, "-n", value), "-n")


def test_tsh_config_values_at_their_limits(storage):
    """H-4: ``cache_capacity`` is a positive integer of at most 65536.  Through ``ctx tool
    tsh.config``, 65536 is written as given; 65537, 1.5, ``1_000``, ``+5``, an Arabic-Indic
    digit, an empty value and 5000 digits are refused
    (exit 2, EINVAL naming the key) and leave the file byte for byte."""
    config = storage / "tool" / "tsh.d" / "config"
    taken = on(storage, "tool", "tsh.config", "cache_capacity=65536")
    assert taken.rc == 0 and "cache_capacity=65536" in taken.lines(), taken
    kept = config.read_bytes()
    for value in ("65537", "1.5", "1_000", "+5", "\u0663", "", THOUSANDS_OF_DIGITS):
        refused = on(storage, "tool", "tsh.config", f"cache_capacity={value}")
        assert refused.rc == 2 and "EINVAL" in refused.err, (value, refused)
        assert "cache_capacity" in refused.err, refused
        no_traceback(refused)
        assert config.read_bytes() == kept, value


def manifest(directory: Path, number: str, schema: str = '{"type": "object"}') -> Path:
    """A v2 manifest (T-8) whose ``manifest`` field is the JSON text ``number``."""
    directory.mkdir(exist_ok=True)
    (directory / "t.sh").write_text("#!/bin/sh\necho '{}'\n")
    path = directory / "t.json"
    path.write_text(
        f'{{"manifest": {number}, "kind": "tool", "name": "t", "description": "d", '
        f'"schema": {schema}, "cap": {{"side_effects": false, "network": false}}, '
        f'"exec": "t.sh"}}'
    )
    return path


def test_manifest_version_numbers_at_their_limits(storage, tmp_path):
    """T-8: ``"manifest": 2`` is the version, also as 2.0 or 2e0; -0, 2**63+2, true, "2",
    1e309 and an integer of 5000 digits are refused (exit 1,
    EINVAL), no traceback."""
    for good in ("2.0", "2e0"):
        checked = on(storage, "object", "check", manifest(tmp_path / "m", good))
        assert checked.rc == 0, (good, checked)
    for number in ("-0", str(2**63 + 2), "true", '"2"', "1e309", "2" + "0" * 5000):
        refused = on(storage, "object", "check", manifest(tmp_path / "m", number))
        assert refused.rc == 1 and "EINVAL" in refused.out + refused.err, (number, refused)
        no_traceback(refused)


def test_a_schema_reference_to_an_index_of_thousands_of_digits_is_einval(storage, tmp_path):
    """T-8: a ``$ref`` to ``#/examples/5`` in a schema of one example is refused as a
    reference to what the schema does not hold (EINVAL, exit 1); one to an index of 5000
    digits is refused the same way, not with a traceback."""
    template = (
        '{{"type": "object", "examples": [{{}}], '
        '"properties": {{"a": {{"$ref": "#/examples/{}"}}}}}}'
    )
    near = on(storage, "object", "check", manifest(tmp_path / "m", "2", template.format(5)))
    assert near.rc == 1 and "EINVAL" in near.out + near.err, near
    far = on(storage, "object", "check",
             manifest(tmp_path / "m", "2", template.format(THOUSANDS_OF_DIGITS)))  # fmt: skip
    no_traceback(far)
    assert far.rc == 1 and "EINVAL" in far.out + far.err, far
